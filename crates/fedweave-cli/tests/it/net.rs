//! The networked runtime's faults with real processes on loopback: a client
//! killed with SIGKILL and restarted, and a server killed with SIGKILL and
//! resumed while its clients wait.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Four digits clients, an MLP, checkpoints every round.
fn write_config(dir: &Path, algorithm: &str, rounds: usize, extra: &str) -> String {
    let p = dir.join("cfg.toml");
    let text = format!(
        "seed = 5\nclients = 4\nrounds = {rounds}\nthreads = 1\ncheckpoint_every = 1\n{extra}\n\
         [data]\ndataset = \"digits\"\n[partition]\nkind = \"dirichlet\"\nbeta = 0.5\n\
         [model]\nkind = \"mlp\"\n[train]\nlocal_iterations = 40\nbatch_size = 16\n\
         [algorithm]\nname = \"{algorithm}\"\n"
    );
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

fn fedweave() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fedweave"))
}

/// Kills a child on drop, so a failing test leaves no process behind.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        self.0.kill().ok();
        self.0.wait().ok();
    }
}

impl Proc {
    /// Waits for the process at most `secs` seconds; its exit status.
    fn wait(&mut self, secs: u64) -> std::process::ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "timed out after {secs}s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, as `kill -9` does.
    fn kill_9(&mut self) {
        self.0.kill().unwrap();
        self.0.wait().unwrap();
    }
}

/// `fedweave serve` on `listen`; returns it and the address it bound.
fn serve(cfg: &str, out: &Path, listen: &str, resume: bool) -> (Proc, String) {
    let mut cmd = fedweave();
    cmd.args([
        "serve",
        cfg,
        "--listen",
        listen,
        "--out",
        out.to_str().unwrap(),
    ]);
    if resume {
        cmd.arg("--resume");
    }
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix("listening on ").map(str::to_string))
        .expect("the server says where it listens");
    // Keep draining stderr so the server never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    (Proc(child), addr)
}

/// `fedweave worker` (or `client` for one id) with a state directory.
fn clients(cfg: &str, addr: &str, ids: &str, state: &Path, log: &Path) -> Proc {
    let mut cmd = fedweave();
    if let Some(id) = ids.strip_suffix("..") {
        cmd.args(["client", cfg, "--id", id]);
    } else {
        cmd.args(["worker", cfg, "--ids", ids]);
    }
    let child = cmd
        .args(["--connect", &format!("http://{addr}")])
        .args(["--state-dir", state.to_str().unwrap(), "--retry-for", "60"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    Proc(child)
}

/// Finished rounds in a run directory.
fn rounds_done(out: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out.join("rounds.jsonl"))
        .map(|t| {
            t.lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect()
        })
        .unwrap_or_default()
}

fn wait_for_rounds(out: &Path, n: usize, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while rounds_done(out).len() < n {
        assert!(
            Instant::now() < deadline,
            "round {n} not reached in {secs}s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `summary.json` and `rounds.jsonl` without their wall-clock fields.
fn numbers(dir: &Path) -> (serde_json::Value, Vec<serde_json::Value>) {
    let rounds = rounds_done(dir)
        .into_iter()
        .map(|mut r| {
            r["seconds"] = serde_json::Value::Null;
            r
        })
        .collect();
    (crate::cli::summary_numbers(dir), rounds)
}

/// A list of client ids in a round record (an empty list is left out).
fn ids(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .map(|a| a.iter().map(|x| x.as_u64().unwrap()).collect())
        .unwrap_or_default()
}

/// A client killed with SIGKILL: once `round_timeout` passes, the rounds go
/// on with the three others (`min_clients = 3`) and record it absent; the
/// client started again takes its id back (its saved session) and continues
/// from its own checkpoint, and the last rounds have all four.
#[test]
fn a_killed_client_is_recorded_absent_and_rejoins_from_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        "fedavg",
        9,
        "round_timeout = 1.5\nmin_clients = 3",
    );
    let out = dir.path().join("run");
    let state = dir.path().join("state");
    let (mut server, addr) = serve(&cfg, &out, "127.0.0.1:0", false);
    let mut workers = clients(&cfg, &addr, "0..3", &state, &dir.path().join("w.log"));
    let mut three = clients(&cfg, &addr, "3..", &state, &dir.path().join("c3.log"));
    wait_for_rounds(&out, 2, 120);
    three.kill_9();
    let killed_after = rounds_done(&out).len();
    wait_for_rounds(&out, killed_after + 3, 120);
    let log = dir.path().join("c3-again.log");
    let mut again = clients(&cfg, &addr, "3..", &state, &log);
    assert!(server.wait(180).success(), "the run finished");
    assert!(workers.wait(30).success());
    assert!(again.wait(30).success());

    let rounds = rounds_done(&out);
    assert_eq!(rounds.len(), 9);
    // The round the kill fell in may or may not have had client 3's answer;
    // the two after it did not, and each waited out the timeout.
    for r in &rounds[killed_after + 1..killed_after + 3] {
        assert_eq!(ids(&r["absent"]), [3], "round {}", r["round"]);
        assert!(r["seconds"].as_f64().unwrap() >= 1.5);
    }
    assert_eq!(ids(&rounds[8]["absent"]), Vec::<u64>::new());
    assert_eq!(ids(&rounds[8]["participants"]), [0, 1, 2, 3]);
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        log.contains("continuing from its checkpoint"),
        "the restarted client used its own state: {log}"
    );
    assert!(!log.contains("already connected"), "{log}");
}

/// The server killed with SIGKILL after round 3: `serve --resume` on the
/// same address continues from its checkpoint, the waiting clients (which
/// retry with backoff) join again, and the result equals an uninterrupted
/// `fedweave run` of the same config.
#[test]
fn a_server_killed_with_kill_9_resumes_and_equals_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), "pfedgraph", 7, "");
    let whole = dir.path().join("whole");
    let o = fedweave()
        .args(["run", &cfg, "--out", whole.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let out = dir.path().join("served");
    let (mut server, addr) = serve(&cfg, &out, "127.0.0.1:0", false);
    let state: PathBuf = dir.path().join("state");
    let mut workers = clients(&cfg, &addr, "0..4", &state, &dir.path().join("w.log"));
    wait_for_rounds(&out, 3, 120);
    server.kill_9();
    assert!(!out.join("summary.json").exists(), "killed before the end");
    let (mut resumed, again) = serve(&cfg, &out, &addr, true);
    assert_eq!(again, addr);
    assert!(resumed.wait(180).success(), "the resumed run finished");
    assert!(workers.wait(30).success());
    assert_eq!(numbers(&out), numbers(&whole));
}
