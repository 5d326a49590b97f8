//! The registry is the one list of algorithms: the README's table, `fedweave
//! list` and config validation must agree with it.

use fedweave_algos::{AlgoError, catalogue, check_params};

/// The names in the first column of the README's `## Algorithms` table.
fn readme_names() -> Vec<String> {
    let readme = include_str!("../../../README.md");
    let table = readme
        .split("## Algorithms")
        .nth(1)
        .expect("README has an Algorithms section");
    table
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .flat_map(|row| {
            let first = row.split('|').nth(1).unwrap_or("");
            first
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn readme_table_lists_exactly_the_registered_algorithms() {
    let mut registered: Vec<String> = catalogue().iter().map(|a| a.name.to_string()).collect();
    let mut documented = readme_names();
    registered.sort();
    documented.sort();
    assert_eq!(documented, registered);
}

#[test]
fn names_are_unique_and_described() {
    let all = catalogue();
    for (k, a) in all.iter().enumerate() {
        assert!(
            all[..k].iter().all(|b| b.name != a.name),
            "{} twice",
            a.name
        );
        assert!(
            !a.summary.is_empty() && !a.reference.is_empty(),
            "{}",
            a.name
        );
    }
}

#[test]
fn parameters_are_checked_once_with_the_key_named() {
    for a in catalogue() {
        let resolved = check_params(a.name, &toml::Table::new(), 10)
            .unwrap_or_else(|e| panic!("{}: defaults must be valid: {e}", a.name));
        // The resolved table parses again to the same table.
        assert_eq!(
            check_params(a.name, &resolved, 10).unwrap(),
            resolved,
            "{}",
            a.name
        );
        let mut bad = toml::Table::new();
        bad.insert("no_such_key".into(), toml::Value::Integer(1));
        let e = check_params(a.name, &bad, 10).unwrap_err().to_string();
        assert!(e.contains("algorithm.no_such_key"), "{}: {e}", a.name);
    }
    let mut bad = toml::Table::new();
    bad.insert("top_k".into(), toml::Value::Integer(0));
    let e = check_params("feddwa", &bad, 10).unwrap_err().to_string();
    assert!(e.contains("algorithm.top_k must be at least 1"), "{e}");
    match check_params("fedsomething", &toml::Table::new(), 10) {
        Err(AlgoError::UnknownAlgorithm { known, .. }) => {
            assert!(known.contains("pfedgraph") && known.contains("dpfl"));
        }
        other => panic!("{other:?}"),
    }
}
