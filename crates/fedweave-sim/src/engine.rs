//! The simulated round loop.

use crate::config::ExperimentConfig;
use crate::peer::{SharedMemoryNet, exchange};
use crate::records::{PROTOCOL, RoundRecord, Summary};
use fedweave_algos::attack::{AttackKind, choose_malicious, poison};
use fedweave_algos::{Aggregation, ClientData, ClientState, Env, EvalPoint, Topology, Upload};
use fedweave_core::vecmath::{all_finite, mean, std_dev};
use fedweave_core::{Purpose, rng_stream};
use fedweave_data::{Dataset, Partition, PartitionKind, Task};
use fedweave_nn::{LocalData, ModelSpec, evaluate};
use rand::seq::index::sample;
use rayon::prelude::*;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::Instant;

/// Errors that stop a run before or while it runs.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Dataset or partition problem.
    #[error(transparent)]
    Data(#[from] fedweave_data::DataError),
    /// Model cannot take the dataset's inputs.
    #[error(transparent)]
    Model(#[from] fedweave_nn::NnError),
    /// Bad algorithm name or parameter.
    #[error(transparent)]
    Algorithm(#[from] fedweave_algos::AlgoError),
    /// Writing the outputs failed.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The thread pool could not be built.
    #[error("cannot start worker threads: {0}")]
    Threads(String),
}

/// What the test split says about one client's model.
#[derive(Clone, Copy, Debug, Default)]
struct TestMetrics {
    acc: f64,
    mae: f64,
    rmse: f64,
    mape: f64,
}

/// One client's evaluation: the validation figure the protocol selects on
/// (`val_score`, higher is better: accuracy, or −MAE when forecasting), the
/// validation figure reported, and the test metrics.
#[derive(Clone, Copy, Debug, Default)]
struct Score {
    val_score: f64,
    val_reported: f64,
    test: TestMetrics,
}

/// Per-client evaluation bookkeeping for the best-validation protocol.
#[derive(Clone, Copy, Debug, Default)]
struct BestTracker {
    best_val: Option<f64>,
    test_at_best: TestMetrics,
    round: usize,
}

/// Runs one experiment, writing its outputs into `out_dir` (created if
/// needed). `on_round` sees every round's record as soon as it is done.
pub fn run_experiment(
    cfg: &ExperimentConfig,
    out_dir: &Path,
    on_round: &mut dyn FnMut(&RoundRecord),
) -> Result<Summary, RunError> {
    let started = Instant::now();
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| RunError::Io { path, source }
    };
    std::fs::create_dir_all(out_dir).map_err(io(out_dir))?;

    // Data, partition, model, algorithm: every check before any training.
    let mut data_cfg = cfg.data.clone();
    if data_cfg.dataset == "synthetic" {
        data_cfg.synthetic.clients = cfg.clients;
    }
    let dataset = fedweave_data::load_dataset(&data_cfg, cfg.seed)?;
    let partition = fedweave_data::partition(&dataset, &cfg.partition, cfg.clients, cfg.seed)?;
    let forecasting = dataset.task != Task::Classification;
    let outputs = match dataset.task {
        Task::Forecasting { horizon } => horizon,
        Task::Classification => dataset.num_classes,
    };
    let spec = ModelSpec::new(cfg.model.kind, &dataset.feature_shape, outputs)?;
    let (mut algo, resolved) =
        fedweave_algos::build(cfg.algorithm_name(), &cfg.algorithm_params(), cfg.clients)?;
    let mut resolved_cfg = cfg.clone();
    resolved_cfg.algorithm = resolved;
    resolved_cfg
        .algorithm
        .insert("name".into(), toml::Value::String(algo.name().to_string()));
    resolved_cfg.data = data_cfg;
    let threads = cfg
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    resolved_cfg.threads = Some(threads);

    let write = |name: &str, text: &str| -> Result<(), RunError> {
        let p = out_dir.join(name);
        std::fs::write(&p, text).map_err(io(&p))
    };
    write("config.toml", &resolved_cfg.to_toml())?;
    let report = partition.label_counts(&dataset);
    write(
        "partition.json",
        &serde_json::to_string(&report).unwrap_or_default(),
    )?;

    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| RunError::Threads(e.to_string()))?;
    let rounds_path = out_dir.join("rounds.jsonl");
    let mut rounds_file = BufWriter::new(File::create(&rounds_path).map_err(io(&rounds_path))?);

    let malicious = choose_malicious(cfg.seed, cfg.clients, cfg.attack.ratio);
    let is_malicious: Vec<bool> = (0..cfg.clients).map(|i| malicious.contains(&i)).collect();
    let benign: Vec<usize> = (0..cfg.clients).filter(|&i| !is_malicious[i]).collect();
    let flip = |i: usize| {
        (cfg.attack.kind == AttackKind::LabelFlip && is_malicious[i]).then_some(dataset.num_classes)
    };

    let train_cfg = cfg.train.to_train_config();
    let init = spec.init(&mut rng_stream(cfg.seed, 0, u64::MAX, Purpose::ModelInit));
    let sizes = partition.train_sizes();
    let label_counts: Vec<Vec<usize>> = report.clients.iter().map(|c| c.train.clone()).collect();
    let env = Env {
        spec: &spec,
        train: &train_cfg,
        sizes: &sizes,
        init: &init,
        relation: dataset.relation_graph.as_ref(),
        label_counts: &label_counts,
    };
    algo.check(&env)
        .map_err(|message| fedweave_algos::AlgoError::BadParameter {
            algorithm: algo.name().to_string(),
            message,
        })?;
    let wire = spec.layout().wire_bytes();

    let mut states: Vec<ClientState> = (0..cfg.clients)
        .map(|_| ClientState {
            model: init.clone(),
            buffers: spec.init_buffers(),
            ..Default::default()
        })
        .collect();
    let mut best = vec![BestTracker::default(); cfg.clients];
    let mut records: Vec<RoundRecord> = Vec::with_capacity(cfg.rounds);
    let mut last_test = vec![TestMetrics::default(); cfg.clients];
    let (mut total_up, mut total_down) = (0u64, 0u64);

    for round in 1..=cfg.rounds {
        let round_start = Instant::now();
        let participants = choose_participants(cfg, round);

        // Local training, one task per participant.
        let starts: Vec<Option<Vec<f32>>> = participants
            .iter()
            .map(|&i| {
                (is_malicious[i] && cfg.attack.kind == AttackKind::InvGrad)
                    .then(|| states[i].model.clone())
            })
            .collect();
        let mut taking_part = vec![false; cfg.clients];
        participants.iter().for_each(|&i| taking_part[i] = true);
        let mut uploads: Vec<(usize, Upload)> = pool.install(|| {
            let mut slots: Vec<(usize, &mut ClientState)> = states
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| taking_part[*i])
                .collect();
            slots
                .par_iter_mut()
                .map(|(i, state)| {
                    let i = *i;
                    let data = client_data(&dataset, &partition, i, flip(i));
                    let mut rng = rng_stream(cfg.seed, round as u64, i as u64, Purpose::Batches);
                    (i, algo.local_round(&env, round, i, &data, state, &mut rng))
                })
                .collect()
        });

        // Model poisoning, then the server's sanity check on what arrived.
        if cfg.attack.kind.poisons_models() {
            for ((i, up), start) in uploads.iter_mut().zip(&starts) {
                if is_malicious[*i] && !up.model.is_empty() {
                    let start = start.as_deref().unwrap_or(&init);
                    poison(
                        cfg.attack.kind,
                        cfg.attack.uniform,
                        &mut up.model,
                        start,
                        cfg.seed,
                        round,
                        *i,
                    );
                }
            }
        }
        let mut rejected = Vec::new();
        uploads.retain(|(i, up)| {
            let sound = |v: &[f32]| v.len() == init.len() && all_finite(v);
            let ok =
                (up.model.is_empty() || sound(&up.model)) && up.extra.as_deref().is_none_or(sound);
            if !ok {
                tracing::warn!(
                    client = i,
                    round,
                    "upload rejected: non-finite values or wrong size; client sits this round out"
                );
                rejected.push(*i);
            }
            ok
        });
        let mut bytes_up: u64 = uploads.iter().map(|(_, u)| u.vectors as u64 * wire).sum();

        let eval_point = algo.eval_point();
        let mut scores = Vec::new();
        if eval_point == EvalPoint::AfterTraining {
            scores = evaluate_all(&pool, &spec, &dataset, &partition, &states, &benign, &flip);
        }

        // Graph inference and mixing: by a server, or by the clients
        // themselves through the peer message layer.
        let ids: Vec<usize> = uploads.iter().map(|(i, _)| *i).collect();
        let mut selection = None;
        let mut bytes_down = 0u64;
        let agg = if algo.topology() == Topology::PeerToPeer {
            let net = SharedMemoryNet::new(
                cfg.clients,
                uploads.iter().map(|(i, u)| (*i, u.model.as_slice())),
            );
            let selecting: Vec<bool> = (0..cfg.clients)
                .map(|i| ids.contains(&i) && (cfg.attack.run_selection || !is_malicious[i]))
                .collect();
            let data = |i: usize| client_data(&dataset, &partition, i, flip(i));
            let (graph, stats) = pool.install(|| {
                exchange(
                    algo.as_ref(),
                    &env,
                    cfg.seed,
                    round,
                    &mut states,
                    &selecting,
                    &data,
                    &net,
                )
            });
            // Every transfer leaves one peer and reaches another.
            bytes_up = stats.transfers * wire;
            bytes_down = bytes_up;
            selection = Some(stats);
            Aggregation::new(graph, vec![None; cfg.clients])
        } else if ids.is_empty() {
            // With no sound upload there is nothing to infer a graph from:
            // every client keeps its model this round.
            Aggregation::keep_all(cfg.clients)
        } else {
            let refs: Vec<&Upload> = uploads.iter().map(|(_, u)| u).collect();
            algo.aggregate(&env, round, &ids, &refs)
        };
        for (state, dl) in states.iter_mut().zip(agg.downloads) {
            if let Some(dl) = dl {
                bytes_down += wire * (1 + u64::from(dl.aux.is_some()));
                state.model = dl.model;
                state.aux = dl.aux;
            }
        }
        if eval_point == EvalPoint::AfterMixing {
            scores = evaluate_all(&pool, &spec, &dataset, &partition, &states, &benign, &flip);
        }

        // Best-validation bookkeeping (benign clients only).
        for (&i, score) in benign.iter().zip(&scores) {
            let b = &mut best[i];
            if b.best_val.is_none_or(|v| score.val_score > v) {
                *b = BestTracker {
                    best_val: Some(score.val_score),
                    test_at_best: score.test,
                    round,
                };
            }
            last_test[i] = score.test;
        }
        total_up += bytes_up;
        total_down += bytes_down;
        let mean_of = |f: fn(&Score) -> f64| mean(&scores.iter().map(f).collect::<Vec<_>>());
        let losses: Vec<f64> = uploads.iter().map(|(_, u)| u.train_loss).collect();
        let record = RoundRecord {
            round,
            mean_val_acc: (!forecasting).then(|| mean_of(|s| s.val_reported)),
            mean_test_acc: (!forecasting).then(|| mean_of(|s| s.test.acc)),
            mean_val_mae: forecasting.then(|| mean_of(|s| s.val_reported)),
            mean_test_mae: forecasting.then(|| mean_of(|s| s.test.mae)),
            mean_test_rmse: forecasting.then(|| mean_of(|s| s.test.rmse)),
            mean_test_mape: forecasting.then(|| mean_of(|s| s.test.mape)),
            mean_train_loss: mean(&losses),
            seconds: round_start.elapsed().as_secs_f64(),
            bytes_up,
            bytes_down,
            participants: participants.clone(),
            rejected,
            graph: agg.graph.to_rows(),
            graph_layers: agg
                .layers
                .iter()
                .map(|(n, g)| (n.clone(), g.to_rows()))
                .collect(),
            graph_sparsity: agg.graph.sparsity(),
            graph_symmetry: agg.graph.symmetry(),
            selection,
        };
        let line = serde_json::to_string(&record).unwrap_or_default();
        writeln!(rounds_file, "{line}").map_err(io(&rounds_path))?;
        rounds_file.flush().map_err(io(&rounds_path))?;
        on_round(&record);
        records.push(record);
    }

    // The headline per client: accuracy, or MAE when forecasting.
    let headline = |m: &TestMetrics| if forecasting { m.mae } else { m.acc };
    let per_client: Vec<Option<f64>> = (0..cfg.clients)
        .map(|i| (!is_malicious[i]).then_some(headline(&best[i].test_at_best)))
        .collect();
    let benign_best: Vec<f64> = benign
        .iter()
        .map(|&i| headline(&best[i].test_at_best))
        .collect();
    let benign_mean = |f: fn(&TestMetrics) -> f64| {
        mean(
            &benign
                .iter()
                .map(|&i| f(&best[i].test_at_best))
                .collect::<Vec<_>>(),
        )
    };
    let last_mean = mean(
        &benign
            .iter()
            .map(|&i| headline(&last_test[i]))
            .collect::<Vec<_>>(),
    );
    let mut sorted = benign_best.clone();
    // Worst first: lowest accuracy, or highest error.
    sorted.sort_by(|a, b| {
        if forecasting {
            b.total_cmp(a)
        } else {
            a.total_cmp(b)
        }
    });
    let bottom = (sorted.len() / 10).max(1).min(sorted.len());
    let mut secs: Vec<f64> = records.iter().map(|r| r.seconds).collect();
    secs.sort_by(f64::total_cmp);
    let last = records.last();
    let summary = Summary {
        algorithm: algo.name().to_string(),
        dataset: dataset.name.clone(),
        partition: describe_partition(cfg),
        model: format!("{:?}", cfg.model.kind).to_lowercase(),
        model_parameters: init.len(),
        clients: cfg.clients,
        rounds: cfg.rounds,
        seed: cfg.seed,
        attack: if cfg.attack.kind == AttackKind::None {
            "none".into()
        } else {
            format!(
                "{} r={}",
                toml::Value::try_from(cfg.attack.kind)
                    .map(|v| v.as_str().unwrap_or("").to_string())
                    .unwrap_or_default(),
                cfg.attack.ratio
            )
        },
        mean_test_acc: (!forecasting).then(|| mean(&benign_best)),
        last_round_mean_test_acc: (!forecasting).then_some(last_mean),
        max_round_mean_test_acc: records
            .iter()
            .filter_map(|r| r.mean_test_acc)
            .reduce(f64::max),
        std_test_acc: (!forecasting).then(|| std_dev(&benign_best)),
        min_test_acc: sorted.first().copied().filter(|_| !forecasting),
        bottom10_test_acc: (!sorted.is_empty() && !forecasting).then(|| mean(&sorted[..bottom])),
        per_client_test_acc: if forecasting {
            vec![None; cfg.clients]
        } else {
            per_client.clone()
        },
        last_round_mean_test_mae: forecasting.then_some(last_mean),
        per_client_test_mae: forecasting.then_some(per_client),
        worst10_test_mae: (!sorted.is_empty() && forecasting).then(|| mean(&sorted[..bottom])),
        per_client_best_round: (0..cfg.clients)
            .map(|i| (!is_malicious[i]).then_some(best[i].round))
            .collect(),
        mean_test_mae: forecasting.then(|| benign_mean(|m| m.mae)),
        mean_test_rmse: forecasting.then(|| benign_mean(|m| m.rmse)),
        mean_test_mape: forecasting.then(|| benign_mean(|m| m.mape)),
        malicious,
        final_graph: last.map(|r| r.graph.clone()).unwrap_or_default(),
        final_graph_layers: last.map(|r| r.graph_layers.clone()).unwrap_or_default(),
        bytes_up: total_up,
        bytes_down: total_down,
        wall_seconds: started.elapsed().as_secs_f64(),
        seconds_per_round_median: secs.get(secs.len() / 2).copied().unwrap_or(0.0),
        threads,
        protocol: PROTOCOL.to_string(),
    };
    write(
        "summary.json",
        &serde_json::to_string_pretty(&summary).unwrap_or_default(),
    )?;
    if let Err(e) = fedweave_report::write_report(out_dir) {
        tracing::warn!("report.html not written: {e}");
    }
    Ok(summary)
}

/// The round's participants: everyone, or a seeded subset of
/// max(1, round(participation·N)) clients, sorted.
fn choose_participants(cfg: &ExperimentConfig, round: usize) -> Vec<usize> {
    if cfg.participation >= 1.0 {
        return (0..cfg.clients).collect();
    }
    let k = ((cfg.participation * cfg.clients as f64).round() as usize).clamp(1, cfg.clients);
    let mut rng = rng_stream(cfg.seed, round as u64, u64::MAX, Purpose::Participation);
    let mut chosen = sample(&mut rng, cfg.clients, k).into_vec();
    chosen.sort_unstable();
    chosen
}

fn client_data<'a>(
    ds: &'a Dataset,
    part: &'a Partition,
    i: usize,
    flip: Option<usize>,
) -> ClientData<'a> {
    let c = &part.clients[i];
    ClientData {
        train: LocalData {
            flip_labels: flip,
            ..local_view(ds, &ds.train, i, &c.train)
        },
        val: LocalData {
            flip_labels: flip,
            ..local_view(ds, &ds.train, i, &c.val)
        },
    }
}

/// Client `i`'s rows `indices` of `split`: labelled, or forecasting targets
/// with the client's own scale (natural clients are the sensors).
fn local_view<'a>(
    ds: &'a Dataset,
    split: &'a fedweave_data::Split,
    i: usize,
    indices: &'a [usize],
) -> LocalData<'a> {
    match ds.task {
        Task::Classification => LocalData::new(&split.features, &split.labels, indices),
        Task::Forecasting { horizon } => {
            let scale = ds
                .target_scales
                .as_ref()
                .and_then(|s| s.get(i))
                .map_or((0.0, 1.0), |s| (s.mean, s.std));
            LocalData::forecasting(&split.features, &split.targets, horizon, scale, indices)
        }
    }
}

/// The validation and test scores of every benign client's model.
fn evaluate_all(
    pool: &rayon::ThreadPool,
    spec: &ModelSpec,
    ds: &Dataset,
    part: &Partition,
    states: &[ClientState],
    benign: &[usize],
    flip: &(dyn Fn(usize) -> Option<usize> + Sync),
) -> Vec<Score> {
    pool.install(|| {
        benign
            .par_iter()
            .map(|&i| {
                let data = client_data(ds, part, i, flip(i));
                let test = local_view(ds, &ds.test, i, &part.clients[i].test);
                let s = &states[i];
                let val = evaluate(spec, &s.model, &s.buffers, &data.val);
                let t = evaluate(spec, &s.model, &s.buffers, &test);
                let test = TestMetrics {
                    acc: t.accuracy(),
                    mae: t.mae(),
                    rmse: t.rmse(),
                    mape: t.mape(),
                };
                if data.val.is_regression() {
                    Score {
                        val_score: -val.mae(),
                        val_reported: val.mae(),
                        test,
                    }
                } else {
                    Score {
                        val_score: val.accuracy(),
                        val_reported: val.accuracy(),
                        test,
                    }
                }
            })
            .collect()
    })
}

fn describe_partition(cfg: &ExperimentConfig) -> String {
    let p = &cfg.partition;
    match p.kind {
        PartitionKind::Iid => "iid".into(),
        PartitionKind::Dirichlet => format!("dirichlet(beta={})", p.beta),
        PartitionKind::Pathological => {
            format!("pathological(classes_per_client={})", p.classes_per_client)
        }
        PartitionKind::Shards => format!("shards(shards_per_client={})", p.shards_per_client),
        PartitionKind::Groups => format!(
            "groups(groups={}, dominant_fraction={})",
            p.groups, p.dominant_fraction
        ),
        PartitionKind::Natural => "natural".into(),
    }
}
