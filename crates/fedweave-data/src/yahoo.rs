//! Yahoo! Answers topic classification (Zhang, Zhao & LeCun 2015) from
//! `yahoo_answers_csv/train.csv` and `test.csv`: one question per record,
//! `"class","title","content","best answer"`, every field quoted, quotes
//! escaped by doubling, line breaks written as the two characters `\n`.
//! `data.path` is the `yahoo_answers_csv` folder or its parent.
//!
//! - **Labels**: class index 1–10 becomes 0–9.
//! - **Text**: title, content and answer joined by spaces, every `\n`
//!   sequence replaced by a space, lowercased, and split into tokens at
//!   every character that is not alphanumeric (Unicode).
//! - **Vocabulary** (from the training split only): id 0 `<pad>`, id 1
//!   `<unk>`, then the most frequent training tokens (ties by token) up to
//!   `data.vocab_size` ids in all. [`crate::InputKind::Tokens`] reports the
//!   ids actually used: min(`data.vocab_size`, 2 + distinct training tokens).
//! - **Features**: the ids of the first `data.seq_len` tokens (default 256)
//!   as f32, padded with 0; `feature_shape = [seq_len]`. `data.normalize`
//!   has no effect.

use std::collections::HashMap;
use std::path::Path;

use crate::files::{locate, need_path, not_found};
use crate::{DataConfig, DataError, Dataset, InputKind, Split, Task};

const CLASSES: usize = 10;
const PAD: u32 = 0;
const UNK: u32 = 1;
/// Largest id an f32 holds exactly.
const MAX_VOCAB: usize = 1 << 24;

/// Loads `yahoo-answers` from `cfg.path`.
pub(crate) fn load(cfg: &DataConfig) -> Result<Dataset, DataError> {
    if !(3..=MAX_VOCAB).contains(&cfg.vocab_size) {
        return Err(DataError::config(
            "data.vocab_size",
            format!(
                "must be in 3..={MAX_VOCAB} (<pad>, <unk> and at least one token), got {}",
                cfg.vocab_size
            ),
        ));
    }
    if cfg.seq_len == 0 {
        return Err(DataError::config("data.seq_len", "must be at least 1"));
    }
    let root = need_path(
        cfg,
        "the yahoo_answers_csv folder holding train.csv and test.csv, or its parent",
    )?;
    let dir = locate(root, &["yahoo_answers_csv"], |d| {
        d.join("train.csv").is_file()
    })
    .ok_or_else(|| {
        not_found(
            root.join("train.csv"),
            format!(
                "no train.csv in {} or {}",
                root.display(),
                root.join("yahoo_answers_csv").display()
            ),
        )
    })?;
    let len = cfg.seq_len;

    // Training split: intern every token (provisional ids in order of first
    // appearance), count it, and keep the provisional ids of the first
    // `len` tokens of each text (u32::MAX = padding).
    let mut intern: HashMap<String, u32> = HashMap::new();
    let mut tokens: Vec<String> = Vec::new();
    let mut counts: Vec<u64> = Vec::new();
    let mut provisional: Vec<u32> = Vec::new();
    let train_path = dir.join("train.csv");
    let train_labels = read_csv(&train_path, |tok, pos| {
        let id = match intern.get(tok) {
            Some(&id) => id,
            None => {
                let id = tokens.len() as u32;
                intern.insert(tok.to_string(), id);
                tokens.push(tok.to_string());
                counts.push(0);
                id
            }
        };
        counts[id as usize] += 1;
        if pos == 0 {
            provisional.extend(std::iter::repeat_n(u32::MAX, len));
        }
        if pos < len {
            let at = provisional.len() - len + pos;
            provisional[at] = id;
        }
    })?;
    let mut order: Vec<u32> = (0..tokens.len() as u32).collect();
    order.sort_by(|&a, &b| {
        counts[b as usize]
            .cmp(&counts[a as usize])
            .then_with(|| tokens[a as usize].cmp(&tokens[b as usize]))
    });
    let keep = (cfg.vocab_size - 2).min(order.len());
    let mut final_id = vec![UNK; tokens.len()];
    for (rank, &p) in order[..keep].iter().enumerate() {
        final_id[p as usize] = rank as u32 + 2;
    }
    drop(tokens);
    drop(counts);
    let train_features = rows_from(&provisional, &train_labels, len, |p| {
        if p == u32::MAX {
            PAD
        } else {
            final_id[p as usize]
        }
    });
    drop(provisional);

    let test_path = dir.join("test.csv");
    if !test_path.is_file() {
        return Err(not_found(
            &test_path,
            format!("test.csv is missing from {}", dir.display()),
        ));
    }
    let mut test_ids: Vec<u32> = Vec::new();
    let test_labels = read_csv(&test_path, |tok, pos| {
        if pos == 0 {
            test_ids.extend(std::iter::repeat_n(PAD, len));
        }
        if pos < len {
            let at = test_ids.len() - len + pos;
            test_ids[at] = intern.get(tok).map_or(UNK, |&p| final_id[p as usize]);
        }
    })?;
    let test_features = rows_from(&test_ids, &test_labels, len, |id| id);

    Ok(Dataset {
        name: "yahoo-answers".to_string(),
        num_classes: CLASSES,
        feature_shape: vec![len],
        train: Split {
            features: train_features,
            labels: train_labels.into_iter().map(|(y, _)| y).collect(),
            ..Split::default()
        },
        test: Split {
            features: test_features,
            labels: test_labels.into_iter().map(|(y, _)| y).collect(),
            ..Split::default()
        },
        natural_clients: None,
        task: Task::Classification,
        relation_graph: None,
        target_scales: None,
        input: InputKind::Tokens {
            vocab_size: keep + 2,
            padded: true,
        },
    })
}

/// Feature rows: texts with at least one token own the next `len` ids of
/// `ids`; texts without any get a row of padding.
fn rows_from(
    ids: &[u32],
    labels: &[(u32, bool)],
    len: usize,
    map: impl Fn(u32) -> u32,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(labels.len() * len);
    let mut rows = ids.chunks_exact(len);
    for &(_, has_tokens) in labels {
        match rows.next().filter(|_| has_tokens) {
            Some(row) => out.extend(row.iter().map(|&p| map(p) as f32)),
            None => out.extend(std::iter::repeat_n(PAD as f32, len)),
        }
    }
    out
}

/// Whether the file's last byte is a line break or a quote.
fn ends_complete(path: &Path) -> Result<bool, DataError> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).map_err(|e| DataError::io(path, e))?;
    let mut last = [0u8; 1];
    f.seek(SeekFrom::End(-1))
        .and_then(|_| f.read_exact(&mut last))
        .map_err(|e| DataError::io(path, e))?;
    Ok(matches!(last[0], b'\n' | b'\r' | b'"'))
}

/// Reads a Yahoo! Answers CSV; calls `token(tok, position)` for every token
/// of every text (position 0 starts a text's row). Returns each record's
/// label (0-based) and whether its text had a token.
fn read_csv(
    path: &Path,
    mut token: impl FnMut(&str, usize),
) -> Result<Vec<(u32, bool)>, DataError> {
    let mut rdr = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_path(path)
        .map_err(|e| match e.into_kind() {
            csv::ErrorKind::Io(io) => DataError::io(path, io),
            other => DataError::format(path, format!("{other:?}")),
        })?;
    let mut labels = Vec::new();
    let mut record = csv::StringRecord::new();
    let mut buf = String::new();
    loop {
        match rdr.read_record(&mut record) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => {
                return Err(DataError::format(
                    path,
                    format!(
                        "record {}: not valid CSV (truncated or corrupt?): {e}",
                        labels.len() + 1
                    ),
                ));
            }
        }
        let n = labels.len() + 1;
        let line = record.position().map_or(0, |p| p.line());
        if record.len() != 4 {
            return Err(DataError::format(
                path,
                format!(
                    "record {n} (line {line}) has {} fields, expected 4 (class, title, content, \
                     answer)",
                    record.len()
                ),
            ));
        }
        let class = record[0].trim();
        let y = match class.parse::<usize>() {
            Ok(c) if (1..=CLASSES).contains(&c) => (c - 1) as u32,
            _ => {
                return Err(DataError::format(
                    path,
                    format!("record {n} (line {line}): class {class:?} is not in 1..={CLASSES}"),
                ));
            }
        };
        let mut pos = 0usize;
        for field in record.iter().skip(1) {
            for part in field.split("\\n") {
                for c in part.chars() {
                    if c.is_alphanumeric() {
                        buf.extend(c.to_lowercase());
                    } else if !buf.is_empty() {
                        token(&buf, pos);
                        pos += 1;
                        buf.clear();
                    }
                }
                if !buf.is_empty() {
                    token(&buf, pos);
                    pos += 1;
                    buf.clear();
                }
            }
        }
        labels.push((y, pos > 0));
    }
    if labels.is_empty() {
        return Err(DataError::format(path, "holds no record"));
    }
    // The csv reader accepts a file cut inside a quoted field. Every field
    // of the distributed files is quoted, so a complete file ends with a
    // closing quote, possibly followed by a line break.
    if !ends_complete(path)? {
        return Err(DataError::format(
            path,
            format!(
                "record {} ends inside a field (no closing quote or line break): the file is \
                 truncated",
                labels.len()
            ),
        ));
    }
    Ok(labels)
}
