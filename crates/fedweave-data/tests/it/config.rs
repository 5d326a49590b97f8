//! Configuration sections: defaults, names and strictness.

use fedweave_data::{
    DataConfig, PartitionConfig, PartitionKind, SyntheticConfig, datasets, load_dataset,
    partition_kinds,
};

#[test]
fn defaults_are_filled() {
    let d: DataConfig = serde_json::from_str("{}").unwrap();
    assert_eq!(d, DataConfig::default());
    assert_eq!(d.dataset, "digits");
    assert!(d.normalize);
    assert_eq!(d.synthetic.dim, 60);
    assert_eq!(d.synthetic.clients, 10);
    let p: PartitionConfig = serde_json::from_str("{}").unwrap();
    assert_eq!(p, PartitionConfig::default());
    assert_eq!(p.kind, PartitionKind::Iid);
    assert_eq!(
        (p.classes_per_client, p.min_samples, p.max_retries),
        (2, 10, 1000)
    );
    assert_eq!(
        (p.beta, p.val_fraction, p.dominant_fraction),
        (0.1, 0.2, 0.8)
    );
    let s: SyntheticConfig = serde_json::from_str(r#"{"alpha": 0.5}"#).unwrap();
    assert_eq!(s.alpha, 0.5);
    assert_eq!(s.beta, 1.0);
}

#[test]
fn kinds_parse_lowercase_and_unknown_keys_fail() {
    let p: PartitionConfig = serde_json::from_str(r#"{"kind": "pathological"}"#).unwrap();
    assert_eq!(p.kind, PartitionKind::Pathological);
    for (name, _) in partition_kinds() {
        let k: PartitionKind = serde_json::from_str(&format!("\"{name}\"")).unwrap();
        assert_eq!(k.as_str(), *name);
        assert_eq!(serde_json::to_string(&k).unwrap(), format!("\"{name}\""));
    }
    assert!(serde_json::from_str::<PartitionKind>("\"Dirichlet\"").is_err());
    let e = serde_json::from_str::<PartitionConfig>(r#"{"betta": 1}"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("betta"), "{e}");
    let e = serde_json::from_str::<DataConfig>(r#"{"synthetic": {"dims": 3}}"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("dims"), "{e}");
}

#[test]
fn listed_datasets_are_loadable_names() {
    let names: Vec<&str> = datasets().iter().map(|d| d.name).collect();
    assert_eq!(
        names,
        [
            "digits",
            "fashion-mnist",
            "mnist",
            "synthetic",
            "us-weather",
            "pems04",
            "pems08",
            "metr-la",
            "pems-bay",
            "cifar10",
            "cifar100",
            "cinic10",
            "emnist",
            "femnist",
            "shakespeare",
            "movielens-100k",
            "yahoo-answers",
            "tiny-imagenet",
            "csv",
            "pfllib",
            "image-folder"
        ]
    );
    assert_eq!(partition_kinds().len(), 11);
    for name in ["digits", "synthetic", "us-weather"] {
        let cfg = DataConfig {
            dataset: name.into(),
            ..DataConfig::default()
        };
        assert_eq!(load_dataset(&cfg, 1).unwrap().name, name);
    }
}

#[test]
fn unknown_dataset_lists_every_name_and_new_keys_parse() {
    let cfg = DataConfig {
        dataset: "imagenet".into(),
        ..DataConfig::default()
    };
    let e = load_dataset(&cfg, 0).unwrap_err().to_string();
    for d in datasets() {
        assert!(e.contains(d.name), "{} missing: {e}", d.name);
    }
    let d: DataConfig = serde_json::from_str(
        r#"{"dataset": "emnist", "emnist_split": "letters", "users": 5, "coarse_labels": true,
            "vocab_size": 1000, "seq_len": 64}"#,
    )
    .unwrap();
    assert_eq!(d.emnist_split, "letters");
    assert_eq!(d.users, Some(5));
    assert!(d.coarse_labels);
    assert_eq!((d.vocab_size, d.seq_len), (1000, 64));
    let d = DataConfig::default();
    assert_eq!(d.emnist_split, "balanced");
    assert_eq!((d.users, d.coarse_labels), (None, false));
    assert_eq!((d.vocab_size, d.seq_len), (50_000, 256));
}
