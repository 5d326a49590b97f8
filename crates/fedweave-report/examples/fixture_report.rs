//! Writes a synthetic run directory and its report, for looking at the page:
//! `cargo run -p fedweave-report --example fixture_report -- DIR [N ROUNDS]`.

#[path = "../tests/fixture/mod.rs"]
mod fixture;

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().unwrap_or_else(|| "/tmp/report-fixture".into()));
    let n: usize = args.next().map_or(Ok(4), |s| s.parse())?;
    let rounds: usize = args.next().map_or(Ok(3), |s| s.parse())?;
    let malicious: Vec<usize> = match n {
        0..=2 => Vec::new(),
        3..=9 => vec![2],
        _ => vec![2, n / 2 + 2],
    };
    fixture::write_fixture(&dir, n, rounds, &malicious);
    let page = fedweave_report::write_report(&dir)?;
    println!("{}", page.display());
    Ok(())
}
