//! LEAF's FEMNIST and Shakespeare, from the JSON files LEAF's preprocessing
//! writes: `train/*.json` and `test/*.json`, each
//! `{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...],
//! "y": [...]}}}` (extra keys such as `hierarchies` are ignored).
//! `data.path` is the folder holding `train/` and `test/` (LEAF's
//! `data/<dataset>/data`) or a parent of it (`data/` or `data/<dataset>/`).
//!
//! **Natural clients.** Every user (FEMNIST: a writer; Shakespeare: a
//! speaking role) is a client. Users are taken in the order of the `users`
//! lists of the train files sorted by file name; with `data.users = N` only
//! the first N are kept (an error when there are fewer), otherwise all. A
//! kept user's train samples are its training pool (the partition carves
//! the validation split off them) and its samples in `test/*.json` its test
//! set; test samples of users that are not kept are dropped.
//!
//! - `femnist`: `x` is 784 floats (28×28, row major, in [0, 1] as LEAF
//!   wrote them: 1 is the white background), `y` the class 0–61 (digits,
//!   upper case, lower case). Features are used as stored;
//!   `data.normalize` has no effect.
//! - `shakespeare`: `x` is an 80-character string, `y` the next character.
//!   Both are mapped through LEAF's 80-letter alphabet
//!   ([`SHAKESPEARE_ALPHABET`]): features are the 80 character indices as
//!   f32 ([`crate::InputKind::Tokens`] with `vocab_size` 80, no padding),
//!   the label the index of `y` (80 classes). A character outside the
//!   alphabet is an error (LEAF's `find` would silently give −1).

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::files::{locate, need_path, not_found, read, sorted_entries};
use crate::{DataConfig, DataError, Dataset, InputKind, NaturalClient, Split, Task};

/// LEAF's character alphabet for Shakespeare (`ALL_LETTERS` in LEAF's
/// `language_utils.py`): a character's class id is its position here.
pub const SHAKESPEARE_ALPHABET: &str =
    "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}";

/// Characters per Shakespeare sample.
const SEQ_LEN: usize = 80;
const FEMNIST_PIXELS: usize = 784;
const FEMNIST_CLASSES: usize = 62;

#[derive(Deserialize)]
struct LeafFile<X, Y> {
    users: Vec<String>,
    #[serde(default)]
    num_samples: Option<Vec<usize>>,
    user_data: HashMap<String, UserData<X, Y>>,
}

#[derive(Deserialize)]
struct UserData<X, Y> {
    x: Vec<X>,
    y: Vec<Y>,
}

/// Loads `femnist` or `shakespeare` from `cfg.path`.
pub(crate) fn load(name: &str, cfg: &DataConfig) -> Result<Dataset, DataError> {
    let root = need_path(
        cfg,
        "LEAF's data folder holding train/ and test/ with the *.json files",
    )?;
    let subs = [
        "data".to_string(),
        format!("{name}/data"),
        format!("data/{name}/data"),
    ];
    let subs: Vec<&str> = subs.iter().map(String::as_str).collect();
    let dir = locate(root, &subs, |d| d.join("train").is_dir()).ok_or_else(|| {
        not_found(
            root.join("train"),
            format!("no LEAF train/ folder in {} (data.path)", root.display()),
        )
    })?;
    if cfg.users == Some(0) {
        return Err(DataError::config("data.users", "must be at least 1"));
    }
    let (train, test, clients) = if name == "femnist" {
        read_leaf::<Vec<f32>, f64>(&dir, name, cfg.users, FEMNIST_PIXELS, femnist_sample)?
    } else {
        read_leaf::<String, String>(&dir, name, cfg.users, SEQ_LEN, shakespeare_sample)?
    };
    let (num_classes, feature_shape, input) = if name == "femnist" {
        (FEMNIST_CLASSES, vec![1, 28, 28], InputKind::Dense)
    } else {
        (
            SHAKESPEARE_ALPHABET.len(),
            vec![SEQ_LEN],
            InputKind::Tokens {
                vocab_size: SHAKESPEARE_ALPHABET.len(),
                padded: false,
            },
        )
    };
    Ok(Dataset {
        name: name.to_string(),
        num_classes,
        feature_shape,
        train,
        test,
        natural_clients: Some(clients),
        task: Task::Classification,
        relation_graph: None,
        target_scales: None,
        input,
    })
}

#[allow(clippy::ptr_arg)] // must match `Convert<Vec<f32>, f64>`
fn femnist_sample(x: &Vec<f32>, y: &f64, out: &mut Vec<f32>) -> Result<u32, String> {
    if x.len() != FEMNIST_PIXELS {
        return Err(format!(
            "x has {} values, FEMNIST images have {FEMNIST_PIXELS}",
            x.len()
        ));
    }
    if let Some(v) = x.iter().find(|v| !v.is_finite()) {
        return Err(format!("x holds the non-finite value {v}"));
    }
    if !(y.fract() == 0.0 && (0.0..FEMNIST_CLASSES as f64).contains(y)) {
        return Err(format!(
            "label {y} is not a class id below {FEMNIST_CLASSES}"
        ));
    }
    out.extend_from_slice(x);
    Ok(*y as u32)
}

fn char_id(c: char) -> Result<u32, String> {
    SHAKESPEARE_ALPHABET
        .chars()
        .position(|a| a == c)
        .map(|i| i as u32)
        .ok_or_else(|| format!("character {c:?} is not in LEAF's 80-letter alphabet"))
}

#[allow(clippy::ptr_arg)] // must match `Convert<String, String>`
fn shakespeare_sample(x: &String, y: &String, out: &mut Vec<f32>) -> Result<u32, String> {
    let n = x.chars().count();
    if n != SEQ_LEN {
        return Err(format!("x has {n} characters, expected {SEQ_LEN}"));
    }
    let mut ys = y.chars();
    let (Some(next), None) = (ys.next(), ys.next()) else {
        return Err(format!("y is {y:?}, expected one character"));
    };
    for c in x.chars() {
        out.push(char_id(c)? as f32);
    }
    char_id(next)
}

/// The `*.json` files of `dir/part`, sorted by name.
fn json_files(dir: &Path, part: &str) -> Result<Vec<std::path::PathBuf>, DataError> {
    let sub = dir.join(part);
    if !sub.is_dir() {
        return Err(not_found(
            &sub,
            format!("LEAF data needs a {part}/ folder of *.json files"),
        ));
    }
    let files: Vec<_> = sorted_entries(&sub)?
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "json") && p.is_file())
        .collect();
    if files.is_empty() {
        return Err(not_found(&sub, format!("no *.json file in {part}/")));
    }
    Ok(files)
}

/// A file's users, each with its data.
type Users<'a, X, Y> = Vec<(&'a String, &'a UserData<X, Y>)>;

type Convert<X, Y> = fn(&X, &Y, &mut Vec<f32>) -> Result<u32, String>;

/// Reads the train and test files: the pools and one client per kept user.
fn read_leaf<X: DeserializeOwned, Y: DeserializeOwned>(
    dir: &Path,
    name: &str,
    users: Option<usize>,
    feature_len: usize,
    convert: Convert<X, Y>,
) -> Result<(Split, Split, Vec<NaturalClient>), DataError> {
    let mut client_of: HashMap<String, usize> = HashMap::new();
    let mut clients: Vec<NaturalClient> = Vec::new();
    let mut train = Split::default();
    for path in json_files(dir, "train")? {
        if users.is_some_and(|n| clients.len() >= n) {
            break;
        }
        let file = parse::<X, Y>(&path)?;
        for (user, data) in each_user(&file, &path)? {
            let c = match client_of.get(user) {
                Some(&c) => c,
                None if users.is_some_and(|n| clients.len() >= n) => continue,
                None => {
                    client_of.insert(user.clone(), clients.len());
                    clients.push(NaturalClient::default());
                    clients.len() - 1
                }
            };
            append(&mut train, data, convert, &path, user, feature_len)?;
            let n = train.labels.len();
            clients[c].train.extend(n - data.y.len()..n);
        }
    }
    if let Some(n) = users
        && clients.len() < n
    {
        return Err(DataError::config(
            "data.users",
            format!(
                "{name} has only {} users in {} but data.users = {n}",
                clients.len(),
                dir.join("train").display()
            ),
        ));
    }
    let mut test = Split::default();
    for path in json_files(dir, "test")? {
        let file = parse::<X, Y>(&path)?;
        for (user, data) in each_user(&file, &path)? {
            let Some(&c) = client_of.get(user) else {
                continue;
            };
            append(&mut test, data, convert, &path, user, feature_len)?;
            let n = test.labels.len();
            clients[c].test.extend(n - data.y.len()..n);
        }
    }
    Ok((train, test, clients))
}

fn parse<X: DeserializeOwned, Y: DeserializeOwned>(
    path: &Path,
) -> Result<LeafFile<X, Y>, DataError> {
    parse_bytes(&read(path)?, path)
}

/// One LEAF JSON file from its bytes; `path` names it in errors.
fn parse_bytes<X: DeserializeOwned, Y: DeserializeOwned>(
    bytes: &[u8],
    path: &Path,
) -> Result<LeafFile<X, Y>, DataError> {
    serde_json::from_slice(bytes).map_err(|e| {
        DataError::format(
            path,
            format!("not a LEAF JSON file (truncated or corrupt?): {e}"),
        )
    })
}

/// The file's users in its `users` order with their data, checked against
/// `num_samples` and `x`/`y` lengths.
fn each_user<'a, X, Y>(
    file: &'a LeafFile<X, Y>,
    path: &Path,
) -> Result<Users<'a, X, Y>, DataError> {
    if let Some(ns) = &file.num_samples
        && ns.len() != file.users.len()
    {
        return Err(DataError::format(
            path,
            format!(
                "\"users\" lists {} users but \"num_samples\" has {} entries",
                file.users.len(),
                ns.len()
            ),
        ));
    }
    file.users
        .iter()
        .enumerate()
        .map(|(i, user)| {
            let data = file.user_data.get(user).ok_or_else(|| {
                DataError::format(path, format!("user {user:?} has no entry in \"user_data\""))
            })?;
            if data.x.len() != data.y.len() {
                return Err(DataError::format(
                    path,
                    format!("user {user:?}: {} x but {} y", data.x.len(), data.y.len()),
                ));
            }
            if let Some(n) = file.num_samples.as_ref().map(|ns| ns[i])
                && n != data.y.len()
            {
                return Err(DataError::format(
                    path,
                    format!(
                        "user {user:?}: \"num_samples\" says {n} but it has {} samples",
                        data.y.len()
                    ),
                ));
            }
            Ok((user, data))
        })
        .collect()
}

fn append<X, Y>(
    split: &mut Split,
    data: &UserData<X, Y>,
    convert: Convert<X, Y>,
    path: &Path,
    user: &str,
    feature_len: usize,
) -> Result<(), DataError> {
    split.features.reserve(data.x.len() * feature_len);
    for (j, (x, y)) in data.x.iter().zip(&data.y).enumerate() {
        let label = convert(x, y, &mut split.features)
            .map_err(|m| DataError::format(path, format!("user {user:?}, sample {j}: {m}")))?;
        split.labels.push(label);
    }
    Ok(())
}

/// Everything the loader does with one file's bytes (parse, check every
/// user, convert every sample), for the fuzz targets: `femnist` images
/// when `femnist`, else Shakespeare text.
#[cfg(feature = "fuzzing")]
pub(crate) fn check_file(bytes: &[u8], femnist: bool) -> Result<Split, DataError> {
    fn run<X: DeserializeOwned, Y: DeserializeOwned>(
        bytes: &[u8],
        feature_len: usize,
        convert: Convert<X, Y>,
    ) -> Result<Split, DataError> {
        let path = Path::new(crate::fuzzing::INPUT);
        let file = parse_bytes::<X, Y>(bytes, path)?;
        let mut split = Split::default();
        for (user, data) in each_user(&file, path)? {
            append(&mut split, data, convert, path, user, feature_len)?;
        }
        Ok(split)
    }
    if femnist {
        run::<Vec<f32>, f64>(bytes, FEMNIST_PIXELS, femnist_sample)
    } else {
        run::<String, String>(bytes, SEQ_LEN, shakespeare_sample)
    }
}
