//! Grid files: expansion, naming, overrides, and clear errors.

use std::path::Path;

use fedweave_sweep::{Grid, SweepError};

const BASE: &str = "clients = 4\nrounds = 2\n[data]\ndataset = \"digits\"\n[partition]\nkind = \"dirichlet\"\nbeta = 0.5\n[train]\nlocal_iterations = 2\n";

fn parse(text: &str) -> Result<Grid, SweepError> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("base.toml"), BASE).unwrap();
    Grid::parse(text, dir.path(), "test.toml")
}

fn err(text: &str) -> String {
    match parse(text).and_then(|g| g.plan().map(|_| g)) {
        Ok(_) => panic!("should fail: {text}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn cartesian_times_seeds_plus_cases() {
    let g = parse(
        r#"
base = "base.toml"
seeds = [1, 2]
[grid]
"algorithm.name" = ["fedavg", "pfedgraph", "local"]
partition.beta = [0.1, 0.5]
[set]
rounds = 3
[[case]]
"algorithm.name" = "fedavg"
"train.lr" = 0.01
"#,
    )
    .unwrap();
    let plan = g.plan().unwrap();
    assert_eq!(plan.runs.len(), (3 * 2 + 1) * 2);
    assert_eq!(plan.keys, ["algorithm.name", "partition.beta", "train.lr"]);
    let names: Vec<&str> = plan.runs.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names[0], "algorithm=fedavg__beta=0.1__seed=1");
    assert_eq!(names[1], "algorithm=fedavg__beta=0.1__seed=2");
    assert_eq!(names[2], "algorithm=fedavg__beta=0.5__seed=1");
    assert_eq!(names[4], "algorithm=pfedgraph__beta=0.1__seed=1");
    assert_eq!(names[12], "algorithm=fedavg__lr=0.01__seed=1");
    let unique: std::collections::BTreeSet<&str> = names.iter().copied().collect();
    assert_eq!(unique.len(), names.len(), "names are unique");
    for n in &names {
        assert!(
            n.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._+-=".contains(c)),
            "{n}"
        );
    }
    // Overrides are applied: [set], grid values, case values, the seed.
    let r = &plan.runs[7];
    assert_eq!(r.config.algorithm_name(), "pfedgraph");
    assert_eq!(r.config.partition.beta, 0.5);
    assert_eq!(r.config.seed, 2);
    assert_eq!(r.config.rounds, 3);
    assert_eq!(r.config.clients, 4);
    let case = &plan.runs[13];
    assert_eq!(case.config.train.lr, 0.01);
    assert_eq!(case.config.partition.beta, 0.5, "base value kept");
    // Names and fingerprints are stable.
    let again = parse(
        r#"
seeds = [1, 2]
base = "base.toml"
[set]
rounds = 3
[grid]
partition = { beta = [0.1, 0.5] }
algorithm = { name = ["fedavg", "pfedgraph", "local"] }
[[case]]
train = { lr = 0.01 }
algorithm = { name = "fedavg" }
"#,
    )
    .unwrap()
    .plan()
    .unwrap();
    for (a, b) in plan.runs.iter().zip(&again.runs) {
        assert_eq!(a.name, b.name);
        assert_eq!(a.fingerprint, b.fingerprint);
    }
    // Different seeds, different fingerprints.
    assert_ne!(plan.runs[0].fingerprint, plan.runs[1].fingerprint);
}

#[test]
fn inline_base_and_default_seed() {
    let plan = parse(
        "[base]\nseed = 7\nclients = 4\nrounds = 2\n[base.data]\ndataset = \"digits\"\n[grid]\nrounds = [1, 2]\n",
    )
    .unwrap()
    .plan()
    .unwrap();
    let names: Vec<&str> = plan.runs.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["rounds=1__seed=7", "rounds=2__seed=7"]);
    assert_eq!(plan.runs[1].config.rounds, 2);
}

#[test]
fn no_grid_is_one_setting() {
    let plan = parse("base = \"base.toml\"\nseeds = [3, 4]\n")
        .unwrap()
        .plan()
        .unwrap();
    let names: Vec<&str> = plan.runs.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["seed=3", "seed=4"]);
}

#[test]
fn sanitised_names_stay_unique() {
    let plan = parse(
        "base = \"base.toml\"\n[grid]\n\"data.path\" = [\"a/b\", \"a b\"]\n\"algorithm.name\" = [\"fedavg\"]\n",
    )
    .unwrap()
    .plan()
    .unwrap();
    assert_eq!(plan.runs.len(), 2);
    assert_ne!(plan.runs[0].name, plan.runs[1].name);
    assert!(
        plan.runs[0].name.starts_with("algorithm=fedavg__path=a_b"),
        "{}",
        plan.runs[0].name
    );
    assert!(!plan.runs[0].name.contains('/'));
}

#[test]
fn bad_grids_fail_clearly() {
    let e = err("seeds = [1]\n[grid]\nrounds = [1]\n");
    assert!(e.contains("missing base"), "{e}");
    let e = err("base = \"nope.toml\"\n");
    assert!(
        e.contains("nope.toml") && e.contains("cannot be read"),
        "{e}"
    );
    let e = err("base = \"base.toml\"\n[grid]\n\"train.learning_rate\" = [0.1, 0.2]\n");
    assert!(
        e.contains("run `learning_rate=0.1__seed=1`") && e.contains("learning_rate"),
        "{e}"
    );
    let e = err("base = \"base.toml\"\n[grid]\n\"partition.beta\" = []\n");
    assert!(
        e.contains("partition.beta") && e.contains("empty list"),
        "{e}"
    );
    let e = err("base = \"base.toml\"\n[grid]\n\"partition.beta\" = 0.1\n");
    assert!(
        e.contains("partition.beta") && e.contains("must be a list"),
        "{e}"
    );
    let e = err("base = \"base.toml\"\nseeds = []\n");
    assert!(e.contains("seeds"), "{e}");
    let e = err("base = \"base.toml\"\nseeds = [1, -2]\n");
    assert!(e.contains("seeds"), "{e}");
    let e = err("base = \"base.toml\"\ngird = {}\n");
    assert!(e.contains("unknown key `gird`"), "{e}");
    let e = err("base = \"base.toml\"\n[grid]\nseed = [1, 2]\n");
    assert!(e.contains("seeds"), "{e}");
    let e = err("base = \"base.toml\"\n[grid]\nrounds = [1, 2]\n[[case]]\nrounds = 2\n");
    assert!(e.contains("appears twice"), "{e}");
    let e = err("base = \"base.toml\"\n[grid]\nrounds = [1, 0]\n");
    assert!(e.contains("rounds=0") && e.contains("rounds"), "{e}");
    let e = err("base = \"base.toml\"\nrows = \"train.lr\"\n[grid]\nrounds = [1]\n");
    assert!(e.contains("train.lr"), "{e}");
    let e = err("base = \"base.toml\"\n[grid\n");
    assert!(e.contains("not valid TOML"), "{e}");
}

#[test]
fn reads_files_relative_to_the_grid() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    std::fs::write(dir.path().join("sub/base.toml"), BASE).unwrap();
    std::fs::write(
        dir.path().join("sub/grid.toml"),
        "base = \"base.toml\"\n[grid]\nrounds = [1, 2]\n",
    )
    .unwrap();
    let plan = Grid::read(&dir.path().join("sub/grid.toml"))
        .unwrap()
        .plan()
        .unwrap();
    assert_eq!(plan.runs.len(), 2);
    assert!(Grid::read(Path::new("/definitely/not/here.toml")).is_err());
}

#[test]
fn the_example_grid_plans_twelve_runs() {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/sweep_digits.toml");
    let plan = Grid::read(&p).unwrap().plan().unwrap();
    assert_eq!(plan.runs.len(), 12);
    assert_eq!(plan.rows.as_deref(), Some("algorithm.name"));
    assert_eq!(plan.runs[0].name, "algorithm=fedavg__beta=0.1__seed=1");
    assert_eq!(plan.runs[0].config.clients, 10);
}

#[test]
fn jobs_divide_the_cores() {
    use fedweave_sweep::exec::threads_per_run;
    assert_eq!(threads_per_run(16, 1), 16);
    assert_eq!(threads_per_run(16, 3), 5);
    assert_eq!(threads_per_run(2, 4), 1);
    assert_eq!(threads_per_run(8, 0), 8);
}

/// `fedweave sweep --set`: replaces a `[set]` key or adds one, for every
/// run; a key the grid varies, or a malformed override, is refused.
#[test]
fn command_line_overrides_apply_on_top_of_set() {
    let text = r#"
base = "base.toml"
[grid]
"algorithm.name" = ["fedavg", "local"]
[set]
rounds = 3
"#;
    let mut g = parse(text).unwrap();
    g.override_set(&[
        "rounds=7".into(),
        "train.lr = 0.5".into(),
        "attack.kind=sign_flip".into(),
        "attack.ratio=0.25".into(),
    ])
    .unwrap();
    let plan = g.plan().unwrap();
    assert_eq!(plan.runs.len(), 2);
    for r in &plan.runs {
        assert_eq!(r.config.rounds, 7);
        assert_eq!(r.config.train.lr, 0.5);
        assert_eq!(format!("{:?}", r.config.attack.kind), "SignFlip");
        assert_eq!(r.config.attack.ratio, 0.25);
    }
    let refused = |a: &str| {
        parse(text)
            .unwrap()
            .override_set(&[a.into()])
            .unwrap_err()
            .to_string()
    };
    assert!(
        refused("algorithm.name=ditto").contains("varied by the grid"),
        "{}",
        refused("algorithm.name=ditto")
    );
    assert!(refused("rounds").contains("key=value"));
}
