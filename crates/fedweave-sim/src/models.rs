//! The models a run keeps: each benign client's best-validation model (the
//! one its `per_client_test_acc` in `summary.json` was computed from) and
//! its model of the last round (the one behind `last_round_mean_test_acc`).
//!
//! Layout of a run directory:
//!
//! - `models/model.json` — the architecture ([`ModelCard`]): model kind,
//!   input shape, outputs, and the flat layout's tensors;
//! - `models/best/client-I.safetensors` and `models/last/client-I.safetensors`
//!   — client I's model exactly as it was scored: tensor `params` (the flat
//!   F32 parameter vector, layout as in `model.json`) and, for models with
//!   batch norm, `buffers` (running means and variances); the metadata entry
//!   `fedweave` (JSON) says `client`, `which`, `round` (when it was scored),
//!   `algorithm`, `exact`.
//!
//! A file holds 4 bytes per parameter and buffer value plus a header of
//! about 300 bytes (`cnn-bn` on 1×28×28: 2.33 MB a client). A best model is
//! written only in the rounds where the client's best validation score
//! improves, before that round's checkpoint, each file to a temporary name
//! then renamed (never torn); the last models once, after the last round.
//! A run resumed after an interruption replays the rounds after its
//! checkpoint exactly, so it rewrites exactly the models an uninterrupted
//! run writes in those rounds, and ends with the same files.
//!
//! The models are those [`Algorithm::personalized`] returns at the moment
//! the protocol scores them (after training or after receiving, as the
//! algorithm says): for split methods the shared body with the client's own
//! head. Where the algorithm's prediction needs more than that model
//! (`Algorithm::scores_personalized` is false: kNN-Per, FedEM, FedCP) the
//! files say `exact = false`.

use crate::ExperimentConfig;
use crate::engine::RunError;
use crate::packed::le_bytes;
use crate::protocol::{Score, Trackers};
use fedweave_algos::Algorithm;
use fedweave_nn::{InputValues, ModelInput, ModelKind, ModelSpec, SequentialConfig};
use rayon::prelude::*;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The folder of a run directory that holds the kept models.
pub const MODELS_DIR: &str = "models";
/// What a kept model's file says it is.
const FORMAT: &str = "fedweave-model";
/// The metadata key of a kept model's header.
const META_KEY: &str = "fedweave";

/// What a kept model's file says about itself (its metadata entry
/// `fedweave`, as JSON).
#[derive(Serialize, Deserialize)]
struct ModelHeader {
    format: String,
    version: u32,
    client: usize,
    which: Which,
    round: usize,
    algorithm: String,
    exact: bool,
}

/// What `model.json` says it is.
const CARD_FORMAT: &str = "fedweave-model-card";

/// Which of a client's models.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Which {
    /// The model at the client's best validation score.
    Best,
    /// The model scored in the last round.
    Last,
}

impl Which {
    /// Its name in paths and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Which::Best => "best",
            Which::Last => "last",
        }
    }
}

/// Errors reading a run's kept models or writing what is made of them.
#[derive(Debug, thiserror::Error)]
pub enum ModelsError {
    /// The directory holds no run.
    #[error("{} is not a run directory (no config.toml); give the --out directory of a `fedweave run`", .0.display())]
    NotARun(PathBuf),
    /// The run kept no models (written by an older fedweave, or a
    /// networked run, whose server never holds the clients' models).
    #[error("{} holds no kept models ({} is missing): runs of this fedweave keep them; networked runs keep none", .dir.display(), .missing.display())]
    NoModels {
        /// The run directory.
        dir: PathBuf,
        /// The file that is missing.
        missing: PathBuf,
    },
    /// A client id out of range.
    #[error("client {client} does not exist: the run has clients 0..={last}")]
    NoClient {
        /// The client asked for.
        client: usize,
        /// The last client id.
        last: usize,
    },
    /// The client has no model of that kind.
    #[error("client {client} has no {which} model in {}: {why}", .dir.display())]
    NotKept {
        /// The client.
        client: usize,
        /// Best or last.
        which: &'static str,
        /// The run directory.
        dir: PathBuf,
        /// Why not.
        why: String,
    },
    /// No client of the run has a model of that kind.
    #[error("{} has no {which} models: {why}", .dir.display())]
    NoneKept {
        /// Best or last.
        which: &'static str,
        /// The run directory.
        dir: PathBuf,
        /// Why, probably.
        why: &'static str,
    },
    /// The model has no form in the asked-for export format.
    #[error("cannot export a `{kind}` model as {format}: {why}")]
    NoFormat {
        /// The architecture.
        kind: String,
        /// The format asked for.
        format: &'static str,
        /// Why, and what works instead.
        why: String,
    },
    /// An output file exists and may not be replaced.
    #[error("{} exists; pass --overwrite to replace it (or --out another folder)", .0.display())]
    Exists(PathBuf),
    /// A file that exists is not what it should be.
    #[error("{}: {message}", .path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Reading or writing failed.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The model cannot be rebuilt (its description names a model this
    /// fedweave does not build).
    #[error(transparent)]
    Model(#[from] fedweave_nn::NnError),
    /// The run's data cannot be loaded to score the models.
    #[error(transparent)]
    Run(#[from] Box<RunError>),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ModelsError + '_ {
    move |source| ModelsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `bytes` to `target` through a temporary file in the same folder,
/// synced and renamed over it: a crash leaves the old file or the new one,
/// never a torn one.
pub(crate) fn write_atomic(target: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic_with(target, |tmp| std::fs::write(tmp, bytes))
}

/// [`write_atomic`] for a file that `write` creates at the path it is given.
pub(crate) fn write_atomic_with(
    target: &Path,
    write: impl FnOnce(&Path) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let name = target
        .file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy().into_owned());
    let tmp = target.with_file_name(format!("{name}.tmp"));
    write(&tmp)?;
    std::fs::File::open(&tmp).and_then(|f| f.sync_all())?;
    std::fs::rename(&tmp, target)
}

/// Syncs a folder, so the renames into it are durable.
pub(crate) fn sync_dir(folder: &Path) -> std::io::Result<()> {
    std::fs::File::open(folder).and_then(|f| f.sync_all())
}

/// A client's model as the protocol scored it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// The flat parameter vector.
    pub params: Vec<f32>,
    /// Batch-norm running statistics (empty without batch norm).
    pub buffers: Vec<f32>,
}

/// The models scored in one round that the books may keep: those whose
/// validation score beats the client's best before the round (candidates
/// for a new best), and in the final round every scored model (the last
/// models). Which candidate became the best is read off the trackers once
/// the round's books are closed ([`Stash::resolve`]).
pub(crate) struct Stash {
    /// Each client's best validation score before the round.
    floor: Vec<Option<f64>>,
    /// The final round: keep every scored model.
    every: bool,
    /// (client, validation score, model), in the order scored.
    entries: Vec<(usize, f64, Snapshot)>,
}

/// What a round leaves to keep.
pub(crate) struct Kept {
    /// New best models: (client, model).
    pub best: Vec<(usize, Snapshot)>,
    /// The last round's models, in the final round.
    pub last: Option<Vec<(usize, Snapshot)>>,
}

impl Stash {
    /// A stash for the round after `trackers`' state; `final_round` keeps
    /// every scored model.
    pub fn new(trackers: &Trackers, final_round: bool) -> Self {
        Self {
            floor: trackers.best.iter().map(|b| b.best_val).collect(),
            every: final_round,
            entries: Vec::new(),
        }
    }

    /// Offers client `i`'s model `state`, just scored `score`.
    pub fn offer<A: Algorithm>(&mut self, algo: &A, i: usize, score: &Score, state: &A::Client) {
        let beats = self
            .floor
            .get(i)
            .is_some_and(|f| f.is_none_or(|v| score.val_score > v));
        if self.every || beats {
            let model = algo.personalized(state);
            let snapshot = Snapshot {
                params: model.params.into_owned(),
                buffers: model.buffers.to_vec(),
            };
            self.entries.push((i, score.val_score, snapshot));
        }
    }

    /// The round's new best models (every client whose tracker now names
    /// round `round`, with the first model scored at its best validation
    /// score, as the trackers keep the earliest on ties) and, in the final
    /// round, each client's last scored model.
    pub fn resolve(self, trackers: &Trackers, round: usize) -> Kept {
        let mut entries: Vec<Option<(usize, f64, Snapshot)>> =
            self.entries.into_iter().map(Some).collect();
        let mut best = Vec::new();
        for (i, b) in trackers.best.iter().enumerate() {
            let Some(v) = b.best_val.filter(|_| b.round == round) else {
                continue;
            };
            let hit = entries.iter().position(|e| {
                e.as_ref()
                    .is_some_and(|(c, s, _)| *c == i && s.to_bits() == v.to_bits())
            });
            match hit {
                Some(k) => {
                    let model = if self.every {
                        entries[k].as_ref().map(|e| e.2.clone())
                    } else {
                        entries[k].take().map(|e| e.2)
                    };
                    best.extend(model.map(|m| (i, m)));
                }
                None => tracing::warn!(client = i, round, "best model not found among the scored"),
            }
        }
        let last = self.every.then(|| {
            let mut last: Vec<Option<Snapshot>> = vec![None; self.floor.len()];
            for (i, _, m) in entries.into_iter().flatten() {
                last[i] = Some(m);
            }
            last.into_iter()
                .enumerate()
                .filter_map(|(i, m)| m.map(|m| (i, m)))
                .collect()
        });
        Kept { best, last }
    }
}

/// The folder of a run's `which` models.
pub fn models_dir(dir: &Path, which: Which) -> PathBuf {
    dir.join(MODELS_DIR).join(which.name())
}

/// The file of client `client`'s `which` model.
pub fn model_path(dir: &Path, which: Which, client: usize) -> PathBuf {
    models_dir(dir, which).join(format!("client-{client}.safetensors"))
}

/// A kept model's file: its tensors and what it says about itself.
#[derive(Clone, Debug, PartialEq)]
pub struct KeptModel {
    /// The model.
    pub model: Snapshot,
    /// The round it was scored in.
    pub round: usize,
    /// The algorithm of the run.
    pub algorithm: String,
    /// Whether the algorithm's scores are exactly this model's outputs.
    pub exact: bool,
}

/// Writes client `client`'s `which` model (atomically; the folder is not
/// synced, see [`keep`]).
fn write_model(
    dir: &Path,
    which: Which,
    client: usize,
    kept: &KeptModel,
) -> Result<(), ModelsError> {
    let path = model_path(dir, which, client);
    // One metadata entry: a map's order would differ from run to run, and
    // a resumed run must write the same bytes as an uninterrupted one.
    let header = ModelHeader {
        format: FORMAT.to_string(),
        version: 1,
        client,
        which,
        round: kept.round,
        algorithm: kept.algorithm.clone(),
        exact: kept.exact,
    };
    let meta = HashMap::from([(
        META_KEY.to_string(),
        serde_json::to_string(&header).unwrap_or_default(),
    )]);
    let params = le_bytes(&kept.model.params);
    let buffers = le_bytes(&kept.model.buffers);
    let mut views = vec![(
        "params",
        TensorView::new(Dtype::F32, vec![kept.model.params.len()], &params),
    )];
    if !buffers.is_empty() {
        views.push((
            "buffers",
            TensorView::new(Dtype::F32, vec![kept.model.buffers.len()], &buffers),
        ));
    }
    let corrupt = |e: &dyn std::fmt::Display| ModelsError::Corrupt {
        path: path.clone(),
        message: e.to_string(),
    };
    let views = views
        .into_iter()
        .map(|(n, v)| v.map(|v| (n, v)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| corrupt(&e))?;
    let bytes = safetensors::tensor::serialize(views, Some(meta)).map_err(|e| corrupt(&e))?;
    write_atomic(&path, &bytes).map_err(io_err(&path))
}

/// Writes a round's kept models into the run directory `dir` (the run of
/// `algorithm`, scored exactly or not): the new best models, and the last
/// ones after the final round. Called before the round's checkpoint.
pub(crate) fn keep(
    dir: &Path,
    kept: Kept,
    round: usize,
    algorithm: &str,
    exact: bool,
) -> Result<(), RunError> {
    let batches = [(Which::Best, Some(kept.best)), (Which::Last, kept.last)];
    for (which, models) in batches {
        let Some(models) = models.filter(|m| !m.is_empty()) else {
            continue;
        };
        let folder = models_dir(dir, which);
        std::fs::create_dir_all(&folder).map_err(|e| models_io(&folder, e))?;
        // In parallel: each file is synced, and hundreds of syncs one after
        // the other would cost seconds a round.
        models.into_par_iter().try_for_each(|(client, model)| {
            let kept = KeptModel {
                model,
                round,
                algorithm: algorithm.to_string(),
                exact,
            };
            write_model(dir, which, client, &kept).map_err(|e| RunError::Checkpoint {
                path: model_path(dir, which, client).display().to_string(),
                message: e.to_string(),
            })
        })?;
        sync_dir(&folder).map_err(|e| models_io(&folder, e))?;
    }
    Ok(())
}

fn models_io(path: &Path, source: std::io::Error) -> RunError {
    RunError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Reads client `client`'s `which` model from the run directory `dir`.
pub fn read_model(dir: &Path, which: Which, client: usize) -> Result<KeptModel, ModelsError> {
    let path = model_path(dir, which, client);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ModelsError::NotKept {
                client,
                which: which.name(),
                dir: dir.to_path_buf(),
                why: format!(
                    "{} does not exist (a malicious client is never scored; last models exist once a run has finished)",
                    path.display()
                ),
            });
        }
        Err(e) => return Err(io_err(&path)(e)),
    };
    let corrupt = |message: String| ModelsError::Corrupt {
        path: path.clone(),
        message,
    };
    let tensors = SafeTensors::deserialize(&bytes).map_err(|e| corrupt(e.to_string()))?;
    let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| corrupt(e.to_string()))?;
    let head: ModelHeader = header
        .metadata()
        .as_ref()
        .and_then(|m| m.get(META_KEY))
        .and_then(|j| serde_json::from_str(j).ok())
        .filter(|h: &ModelHeader| h.format == FORMAT)
        .ok_or_else(|| corrupt("not a fedweave model file".into()))?;
    let vector = |name: &str| -> Result<Vec<f32>, ModelsError> {
        match tensors.tensor(name) {
            Ok(t) if t.dtype() == Dtype::F32 && t.shape().len() == 1 => Ok(t
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()),
            Ok(_) => Err(corrupt(format!("tensor `{name}` is not a 1-D f32 vector"))),
            Err(_) if name == "buffers" => Ok(Vec::new()),
            Err(e) => Err(corrupt(e.to_string())),
        }
    };
    Ok(KeptModel {
        model: Snapshot {
            params: vector("params")?,
            buffers: vector("buffers")?,
        },
        round: head.round,
        algorithm: head.algorithm,
        exact: head.exact,
    })
}

/// [`read_model`], checked against a finished run's books: a best model
/// must be from the round `summary.json` names as the client's best
/// (`per_client_best_round`). A run started by a fedweave that kept no
/// models and resumed by this one holds best models only for the clients
/// that improved after the resume; the others are refused here.
pub fn read_checked(dir: &Path, which: Which, client: usize) -> Result<KeptModel, ModelsError> {
    let kept = read_model(dir, which, client)?;
    let booked = std::fs::read_to_string(dir.join("summary.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v.get("per_client_best_round")?.get(client)?.as_u64());
    match booked {
        Some(r) if which == Which::Best && r as usize != kept.round => Err(ModelsError::NotKept {
            client,
            which: which.name(),
            dir: dir.to_path_buf(),
            why: format!(
                "its file is from round {} but summary.json has its best validation score in round {r} (a run begun by a fedweave that kept no models, then resumed)",
                kept.round
            ),
        }),
        _ => Ok(kept),
    }
}

/// How a model reads its inputs, as `model.json` records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputCard {
    /// Real values (pixels, readings, features).
    Dense,
    /// Token ids below `vocab`.
    Tokens {
        /// Vocabulary size.
        vocab: usize,
    },
    /// Categorical ids, one per field, each below its cardinality.
    Categorical {
        /// Ids per field.
        cardinalities: Vec<usize>,
    },
}

/// How raw `u8` pixels become the model's inputs: `(p / max − mean) / std`
/// (the dataset loader's own scaling), for the datasets that have one.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PixelScaling {
    /// The raw maximum (16 for digits, 255 for IDX images).
    pub max: f32,
    /// Mean subtracted after dividing.
    pub mean: f32,
    /// Standard deviation divided by.
    pub std: f32,
}

/// One tensor of the flat layout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorCard {
    /// fedweave's name (`conv1.weight`, `fc.bias`).
    pub name: String,
    /// Shape as fedweave stores it (linear weights are `[in, out]`).
    pub shape: Vec<usize>,
    /// Offset in the flat vector.
    pub offset: usize,
}

/// `models/model.json`: what rebuilds a run's model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelCard {
    /// `fedweave-model-card`.
    pub format: String,
    /// The model kind (`cnn`, `cnn-bn`, ...).
    pub kind: ModelKind,
    /// One sample's shape.
    pub input_shape: Vec<usize>,
    /// Output width: classes, or forecast horizon / targets.
    pub outputs: usize,
    /// Whether outputs are class logits (`false`: regression values).
    pub classification: bool,
    /// How the model reads its inputs.
    pub input: InputCard,
    /// `[model] embed_dim`, where set.
    pub embed_dim: Option<usize>,
    /// A `sequential` model's `[model] layers` and `head`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequential: Option<SequentialConfig>,
    /// The dataset the run trained on.
    pub dataset: String,
    /// Raw `u8` pixel scaling, for datasets with one.
    pub pixels: Option<PixelScaling>,
    /// The algorithm of the run.
    pub algorithm: String,
    /// Whether the algorithm's scores are exactly the kept models' outputs.
    pub exact: bool,
    /// Parameters in the flat vector.
    pub parameters: usize,
    /// Buffer values (batch-norm running statistics).
    pub buffers: usize,
    /// The flat layout's tensors, in order.
    pub tensors: Vec<TensorCard>,
}

impl ModelCard {
    /// The card of a run's model.
    pub(crate) fn new(
        spec: &ModelSpec,
        cfg: &ExperimentConfig,
        dataset: &str,
        algorithm: &str,
        exact: bool,
        classification: bool,
        input: &ModelInput,
    ) -> Self {
        Self {
            format: CARD_FORMAT.to_string(),
            kind: spec.kind(),
            input_shape: spec.input_shape().to_vec(),
            outputs: spec.num_classes(),
            classification,
            input: match &input.values {
                InputValues::Dense => InputCard::Dense,
                InputValues::Tokens { vocab } => InputCard::Tokens { vocab: *vocab },
                InputValues::Categorical { cardinalities } => InputCard::Categorical {
                    cardinalities: cardinalities.clone(),
                },
            },
            embed_dim: input.embed_dim,
            sequential: input.sequential.clone(),
            dataset: dataset.to_string(),
            pixels: pixel_scaling(dataset, cfg.data.normalize),
            algorithm: algorithm.to_string(),
            exact,
            parameters: spec.layout().len(),
            buffers: spec.buffer_len(),
            tensors: spec
                .layout()
                .tensors()
                .iter()
                .map(|t| TensorCard {
                    name: t.name.clone(),
                    shape: t.shape.clone(),
                    offset: t.offset,
                })
                .collect(),
        }
    }

    /// Rebuilds the model this card describes.
    pub fn spec(&self) -> Result<ModelSpec, fedweave_nn::NnError> {
        let input = ModelInput {
            values: match &self.input {
                InputCard::Dense => InputValues::Dense,
                InputCard::Tokens { vocab } => InputValues::Tokens { vocab: *vocab },
                InputCard::Categorical { cardinalities } => InputValues::Categorical {
                    cardinalities: cardinalities.clone(),
                },
            },
            embed_dim: self.embed_dim,
            sequential: self.sequential.clone(),
        };
        ModelSpec::with_input(self.kind, &self.input_shape, self.outputs, &input)
    }

    /// Reads `models/model.json` of the run directory `dir`.
    pub fn read(dir: &Path) -> Result<Self, ModelsError> {
        if !dir.join("config.toml").is_file() {
            return Err(ModelsError::NotARun(dir.to_path_buf()));
        }
        let path = card_path(dir);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ModelsError::NoModels {
                    dir: dir.to_path_buf(),
                    missing: path,
                });
            }
            Err(e) => return Err(io_err(&path)(e)),
        };
        let card: Self = serde_json::from_str(&text).map_err(|e| ModelsError::Corrupt {
            path: path.clone(),
            message: e.to_string(),
        })?;
        if card.format != CARD_FORMAT {
            return Err(ModelsError::Corrupt {
                path,
                message: "not a fedweave model card".into(),
            });
        }
        Ok(card)
    }

    /// Writes it as `models/model.json` of `dir`.
    pub(crate) fn write(&self, dir: &Path) -> Result<(), RunError> {
        let path = card_path(dir);
        let folder = dir.join(MODELS_DIR);
        std::fs::create_dir_all(&folder).map_err(|e| models_io(&folder, e))?;
        let text = serde_json::to_string_pretty(self).unwrap_or_default();
        write_atomic(&path, text.as_bytes()).map_err(|e| models_io(&path, e))
    }
}

/// The model card's file.
fn card_path(dir: &Path) -> PathBuf {
    dir.join(MODELS_DIR).join("model.json")
}

/// The scaling of raw pixels the loaders of the image datasets apply.
fn pixel_scaling(dataset: &str, normalize: bool) -> Option<PixelScaling> {
    let (max, (mean, std)) = match dataset {
        "digits" => (
            16.0,
            (
                fedweave_data::digits::DIGITS_MEAN,
                fedweave_data::digits::DIGITS_STD,
            ),
        ),
        "fashion-mnist" => (255.0, (0.2860, 0.3530)),
        "mnist" => (255.0, (0.1307, 0.3081)),
        _ => return None,
    };
    let (mean, std) = if normalize { (mean, std) } else { (0.0, 1.0) };
    Some(PixelScaling { max, mean, std })
}

/// The test accuracy of each client's kept `which` model on its own test
/// split, recomputed from the files (`None` for clients without one): for
/// runs whose models are `exact`, each client's best model gives its
/// `per_client_test_acc` exactly.
pub fn rescore(dir: &Path, which: Which) -> Result<Vec<Option<f64>>, ModelsError> {
    let card = ModelCard::read(dir)?;
    let cfg = ExperimentConfig::from_file(&dir.join("config.toml"), &[])
        .map_err(|e| Box::new(RunError::Config(e)))?;
    let fed = crate::runtime::Derived::load(&cfg).map_err(Box::new)?;
    let env = fed.env();
    let spec = env.spec;
    if spec.layout().len() != card.parameters {
        return Err(ModelsError::Corrupt {
            path: card_path(dir),
            message: "the model card does not describe the run's model".into(),
        });
    }
    (0..cfg.clients)
        .map(|i| match read_model(dir, which, i) {
            Ok(k) => {
                let test = fed.test_data(i);
                let stats = fedweave_nn::evaluate(spec, &k.model.params, &k.model.buffers, &test);
                Ok(Some(stats.accuracy()))
            }
            Err(ModelsError::NotKept { .. }) => Ok(None),
            Err(e) => Err(e),
        })
        .collect()
}
