//! Per-round metrics as TensorBoard event files, because that is what many
//! users already watch.
//!
//! An event file is a sequence of TFRecords (`u64` length, masked CRC-32C
//! of the length, the bytes, masked CRC-32C of the bytes), each holding one
//! `tensorflow.Event` protobuf. The messages are the few fields of
//! TensorFlow's `event.proto` / `summary.proto` that scalars need, encoded
//! with prost; their tags are the official ones, so TensorBoard (and
//! `tensorboard.backend.event_processing`) reads the files. The maintained
//! Rust writer crates depend on protobuf 2 and an old `image`; prost plus
//! crc32c is the smaller, well-kept path.

use crate::RoundRecord;
use prost::Message;
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// The event file a run writes under its output directory. The name is
/// fixed (TensorBoard only needs `tfevents` in it) so a resumed run
/// rewrites its own file instead of adding a second one.
pub const EVENT_FILE: &str = "tensorboard/events.out.tfevents.0.fedweave";

/// `tensorflow.Event`: one record of an event file.
#[derive(Clone, PartialEq, Message)]
pub struct Event {
    /// Seconds since the Unix epoch.
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    /// The x axis of TensorBoard's charts: the round.
    #[prost(int64, tag = "2")]
    pub step: i64,
    /// Set on the first record only (`"brain.Event:2"`).
    #[prost(string, optional, tag = "3")]
    pub file_version: Option<String>,
    /// The scalars of one step.
    #[prost(message, optional, tag = "5")]
    pub summary: Option<Summary>,
}

/// `tensorflow.Summary`: the values logged at one step.
#[derive(Clone, PartialEq, Message)]
pub struct Summary {
    /// One entry per tag.
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<SummaryValue>,
}

/// `tensorflow.Summary.Value` with a scalar (`simple_value`).
#[derive(Clone, PartialEq, Message)]
pub struct SummaryValue {
    /// The chart's name, `section/metric`.
    #[prost(string, tag = "1")]
    pub tag: String,
    /// The value.
    #[prost(float, optional, tag = "2")]
    pub simple_value: Option<f32>,
}

/// What goes wrong reading or writing an event file.
#[derive(Debug, thiserror::Error)]
pub enum EventFileError {
    /// The file could not be created, written or read.
    #[error("{path}: {source}")]
    Io {
        /// The event file.
        path: String,
        /// The cause.
        source: io::Error,
    },
    /// A record's framing or checksum is wrong, or its bytes are not an
    /// Event.
    #[error("{path}: record {index} is corrupt: {message}")]
    Corrupt {
        /// The event file.
        path: String,
        /// The 0-based record.
        index: usize,
        /// What is wrong.
        message: String,
    },
}

/// Appends events to one event file.
pub struct EventWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl EventWriter {
    /// Creates (or truncates) `path`, making its folder, and writes the
    /// file-version record TensorBoard expects first.
    pub fn create(path: &Path, wall_time: f64) -> Result<Self, EventFileError> {
        let err = io_error(path);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(&err)?;
        }
        let out = BufWriter::new(File::create(path).map_err(&err)?);
        let mut writer = Self {
            path: path.to_path_buf(),
            out,
        };
        writer.write(&Event {
            wall_time,
            step: 0,
            file_version: Some("brain.Event:2".into()),
            summary: None,
        })?;
        Ok(writer)
    }

    /// Writes one round's scalars and flushes, so a TensorBoard watching
    /// the folder sees the round as soon as it ends.
    pub fn round(&mut self, record: &RoundRecord, wall_time: f64) -> Result<(), EventFileError> {
        let value = scalars(record)
            .into_iter()
            .map(|(tag, v)| SummaryValue {
                tag: tag.into(),
                simple_value: Some(v as f32),
            })
            .collect();
        self.write(&Event {
            wall_time,
            step: record.round as i64,
            file_version: None,
            summary: Some(Summary { value }),
        })?;
        self.out.flush().map_err(io_error(&self.path))
    }

    fn write(&mut self, event: &Event) -> Result<(), EventFileError> {
        let data = event.encode_to_vec();
        let len = (data.len() as u64).to_le_bytes();
        let mut frame = Vec::with_capacity(data.len() + 16);
        frame.extend_from_slice(&len);
        frame.extend_from_slice(&masked_crc(&len).to_le_bytes());
        frame.extend_from_slice(&data);
        frame.extend_from_slice(&masked_crc(&data).to_le_bytes());
        self.out.write_all(&frame).map_err(io_error(&self.path))
    }
}

/// Writes a whole run's records to `dir`'s event file (a run from before
/// the option existed, or one a sweep ran without it). Round r is stamped
/// `start + seconds of rounds 1..=r`.
pub fn write_run(
    dir: &Path,
    records: &[RoundRecord],
    start: f64,
) -> Result<PathBuf, EventFileError> {
    let path = dir.join(EVENT_FILE);
    let mut writer = EventWriter::create(&path, start)?;
    let mut t = start;
    for r in records {
        t += r.seconds;
        writer.round(r, t)?;
    }
    Ok(path)
}

/// Reads an event file back, checking every length and data checksum.
pub fn read_events(path: &Path) -> Result<Vec<Event>, EventFileError> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(io_error(path))?;
    let corrupt = |index: usize, message: String| EventFileError::Corrupt {
        path: path.display().to_string(),
        index,
        message,
    };
    let mut events = Vec::new();
    let mut rest = bytes.as_slice();
    while !rest.is_empty() {
        let index = events.len();
        let (len, crc) = match (rest.get(..8), rest.get(8..12)) {
            (Some(len), Some(crc)) => (len, crc),
            _ => return Err(corrupt(index, "truncated header".into())),
        };
        if masked_crc(len).to_le_bytes() != crc {
            return Err(corrupt(index, "length checksum mismatch".into()));
        }
        let n = u64::from_le_bytes(len.try_into().unwrap_or_default());
        let body = usize::try_from(n)
            .ok()
            .and_then(|n| Some((n, rest.get(12..12usize.checked_add(n)?.checked_add(4)?)?)));
        let Some((n, body)) = body else {
            return Err(corrupt(
                index,
                format!("{n} data bytes announced, fewer present"),
            ));
        };
        let (data, crc) = body.split_at(n);
        if masked_crc(data).to_le_bytes() != crc {
            return Err(corrupt(index, "data checksum mismatch".into()));
        }
        events.push(Event::decode(data).map_err(|e| corrupt(index, e.to_string()))?);
        rest = &rest[12 + n + 4..];
    }
    Ok(events)
}

/// The scalars of one round, by tag. Figures a round does not have (no
/// validation split, a classification task's MAE) are left out rather
/// than written as zeros.
pub fn scalars(r: &RoundRecord) -> Vec<(&'static str, f64)> {
    let optional = [
        ("accuracy/val_mean", r.mean_val_acc),
        ("accuracy/test_mean", r.mean_test_acc),
        ("accuracy/test_participants", r.participant_test_acc),
        ("accuracy/val_mean_before_training", r.mean_val_acc_before),
        ("accuracy/test_mean_before_training", r.mean_test_acc_before),
        ("error/val_mae", r.mean_val_mae),
        ("error/test_mae", r.mean_test_mae),
        ("error/test_rmse", r.mean_test_rmse),
        ("error/test_mape", r.mean_test_mape),
        (
            "selection/no_worse_share",
            r.selection.as_ref().map(|s| s.no_worse_share),
        ),
        (
            "selection/mean_reward_gain",
            r.selection.as_ref().map(|s| s.mean_reward_gain),
        ),
        (
            "selection/transfers",
            r.selection.as_ref().map(|s| s.transfers as f64),
        ),
    ];
    let always = [
        ("train/loss", r.mean_train_loss),
        ("time/seconds", r.seconds),
        ("communication/bytes_up", r.bytes_up as f64),
        ("communication/bytes_down", r.bytes_down as f64),
        ("clients/participants", r.participants.len() as f64),
        ("clients/rejected", r.rejected.len() as f64),
        ("graph/sparsity", r.graph_sparsity),
        ("graph/symmetry", r.graph_symmetry),
    ];
    optional
        .into_iter()
        .filter_map(|(tag, v)| v.map(|v| (tag, v)))
        .chain(always)
        .collect()
}

/// CRC-32C (Castagnoli) rotated and offset, as TFRecord stores it so that
/// a checksum of data holding checksums stays well distributed.
fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

fn io_error(path: &Path) -> impl Fn(io::Error) -> EventFileError + '_ {
    move |source| EventFileError::Io {
        path: path.display().to_string(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(round: usize) -> RoundRecord {
        RoundRecord {
            round,
            mean_val_acc: Some(0.5 + round as f64 / 10.0),
            mean_test_acc: Some(0.25),
            mean_train_loss: 1.5,
            seconds: 2.0,
            bytes_up: 1000,
            participants: vec![0, 1, 2],
            ..Default::default()
        }
    }

    #[test]
    fn masked_crc_matches_tensorflow() {
        // CRC-32C("123456789") = 0xE3069283 (the standard check value);
        // rotated right by 15 it is 0x2507C60D, plus 0xA282EAD8 (mod 2³²).
        assert_eq!(masked_crc(b"123456789"), 0xc78a_b0e5);
        // An empty slice: CRC-32C is 0, so the mask alone.
        assert_eq!(masked_crc(b""), 0xa282_ead8);
    }

    #[test]
    fn a_run_round_trips_through_its_event_file() {
        let dir = tempfile::tempdir().unwrap();
        let records: Vec<_> = (1..=3).map(record).collect();
        let path = write_run(dir.path(), &records, 100.0).unwrap();
        assert_eq!(path, dir.path().join(EVENT_FILE));
        let events = read_events(&path).unwrap();
        assert_eq!(events.len(), 4);
        assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
        assert_eq!(events[0].wall_time, 100.0);
        for (e, r) in events[1..].iter().zip(&records) {
            assert_eq!(e.step, r.round as i64);
            assert_eq!(e.wall_time, 100.0 + 2.0 * r.round as f64);
            let values = &e.summary.as_ref().unwrap().value;
            let get = |tag: &str| {
                values
                    .iter()
                    .find(|v| v.tag == tag)
                    .and_then(|v| v.simple_value)
            };
            assert_eq!(
                get("accuracy/val_mean"),
                Some(r.mean_val_acc.unwrap() as f32)
            );
            assert_eq!(get("communication/bytes_up"), Some(1000.0));
            assert_eq!(get("clients/participants"), Some(3.0));
            // No MAE in a classification round: the tag is absent, not 0.
            assert_eq!(get("error/test_mae"), None);
            assert_eq!(values.len(), 10);
        }
        // Writing the same records again gives the same bytes.
        let first = std::fs::read(&path).unwrap();
        write_run(dir.path(), &records, 100.0).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), first);
    }

    #[test]
    fn corrupt_files_are_named_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_run(dir.path(), &[record(1)], 0.0).unwrap();
        let good = std::fs::read(&path).unwrap();
        let check = |bytes: &[u8], needle: &str| {
            std::fs::write(&path, bytes).unwrap();
            let e = read_events(&path).unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        };
        let mut flipped = good.clone();
        let last = flipped.len() - 6;
        flipped[last] ^= 1;
        check(&flipped, "record 1 is corrupt: data checksum");
        check(&good[..good.len() - 3], "record 1 is corrupt: ");
        check(&good[..5], "record 0 is corrupt: truncated header");
        let mut huge = good.clone();
        huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        check(&huge, "record 0 is corrupt: length checksum");
        let missing = dir.path().join("nope");
        assert!(matches!(
            read_events(&missing),
            Err(EventFileError::Io { .. })
        ));
    }
}
