//! Forecasting datasets: one time series per sensor, sensors linked by a
//! relation graph, every sensor a natural client (SFL's traffic setting).
//!
//! - `us-weather` (bundled): NOAA GHCN-Daily 2025, 144 US stations × 365
//!   days of daily mid-range temperature (°C) with an observation mask and a
//!   symmetric 6-nearest-neighbour station graph (Gaussian weights).
//! - `pems04` / `pems08`: the published PeMS format — `PEMS04.npz` with
//!   `data` of shape (T, N, 3) (flow, occupancy, speed; channel 0 is used)
//!   and `PEMS04.csv` with `from,to,cost` road distances. Flow readings of
//!   exactly 0 are treated as missing, as the masked metrics of the traffic
//!   literature do. Graph weights w_ij = exp(−(d_ij/σ)²), σ the standard
//!   deviation of the listed distances (DCRNN's Gaussian kernel).
//! - `metr-la` / `pems-bay`: DCRNN's traffic-speed releases (Li et al.,
//!   ICLR 2018; SFL's traffic setting), converted once from `metr-la.h5` +
//!   `adj_mx.pkl` (`pems-bay.h5` + `adj_mx_bay.pkl`) by
//!   `scripts/traffic_npz.py` into `metr-la.npz` (`pems-bay.npz`) with
//!   `speed` (T, N) and `adjacency` (N, N). Speeds of exactly 0 are missing
//!   readings (DCRNN's masked metrics). The graph is DCRNN's own directed,
//!   thresholded Gaussian-kernel matrix: w_ij = `adjacency[i, j]` for i ≠ j,
//!   zero entries dropped (the diagonal is SFL's `self_loops` setting).
//!
//! Samples: the last `input_steps` values predict the next `horizon`. A
//! station's windows are split chronologically 70/10/20 into training,
//! validation and test; values are z-scored per station with the mean and
//! standard deviation of its observed values over the days its training
//! windows cover (no test leakage). Unobserved inputs become 0 (the
//! training mean); unobserved targets are NaN, which losses and metrics
//! skip.

use std::io::{Cursor, Read, Seek};
use std::path::Path;

use fedweave_core::RelationGraph;

use crate::dataset::{Dataset, NaturalClient, Split, TargetScale, Task};
use crate::files::Npz;
use crate::{DataConfig, DataError};

static US_WEATHER_NPZ: &[u8] = include_bytes!("../../../data/us_weather_2025.npz");
const US_WEATHER_NAME: &str = "us_weather_2025.npz (bundled)";

/// Shares of a station's windows for training and validation (the rest is
/// test), in chronological order.
const TRAIN_SHARE: f64 = 0.7;
const VAL_SHARE: f64 = 0.1;

/// A multivariate series: `steps × nodes` values (time-major) and whether
/// each was observed.
struct Series {
    steps: usize,
    nodes: usize,
    values: Vec<f32>,
    observed: Vec<bool>,
}

fn expect_shape(path: &str, name: &str, shape: &[usize], want: &[usize]) -> Result<(), DataError> {
    if shape == want {
        Ok(())
    } else {
        Err(DataError::format(
            path,
            format!("member {name}.npy has shape {shape:?}, expected {want:?}"),
        ))
    }
}

/// Loads `us-weather` from the bundled archive or `path`.
pub(crate) fn load_us_weather(path: Option<&Path>, cfg: &DataConfig) -> Result<Dataset, DataError> {
    match path {
        Some(p) => {
            let bytes = std::fs::read(p).map_err(|e| DataError::io(p, e))?;
            us_weather_from(Cursor::new(bytes), &p.display().to_string(), cfg)
        }
        None => us_weather_from(Cursor::new(US_WEATHER_NPZ), US_WEATHER_NAME, cfg),
    }
}

fn us_weather_from<R: Read + Seek>(
    reader: R,
    path: &str,
    cfg: &DataConfig,
) -> Result<Dataset, DataError> {
    let mut npz = Npz::new(reader, path)?;
    let (values, shape) = npz.array::<f32>("daily_temperature_midrange_c")?;
    let [steps, nodes] = <[usize; 2]>::try_from(shape.as_slice()).map_err(|_| {
        DataError::format(path, format!("member daily_temperature_midrange_c.npy has shape {shape:?}, expected (days, stations)"))
    })?;
    let (mask, mshape) = npz.array::<bool>("observation_mask")?;
    expect_shape(path, "observation_mask", &mshape, &[steps, nodes])?;
    let observed = values
        .iter()
        .zip(&mask)
        .map(|(v, &m)| m && v.is_finite())
        .collect();
    let (n_shape, s) = npz.array::<i32>("adjacency_shape")?;
    expect_shape(path, "adjacency_shape", &s, &[2])?;
    if n_shape != [nodes as i32, nodes as i32] {
        return Err(DataError::format(
            path,
            format!("adjacency_shape is {n_shape:?} but the series has {nodes} stations"),
        ));
    }
    let (indptr, _) = npz.array::<i32>("adjacency_indptr")?;
    let (indices, _) = npz.array::<i32>("adjacency_indices")?;
    let (weights, _) = npz.array::<f64>("adjacency_data")?;
    let to_usize = |v: Vec<i32>, name: &str| -> Result<Vec<usize>, DataError> {
        v.into_iter()
            .map(|x| {
                usize::try_from(x).map_err(|_| {
                    DataError::format(path, format!("member {name}.npy has negative entry {x}"))
                })
            })
            .collect()
    };
    let graph = RelationGraph::from_csr(
        nodes,
        to_usize(indptr, "adjacency_indptr")?,
        to_usize(indices, "adjacency_indices")?,
        weights,
    )
    .map_err(|e| DataError::format(path, format!("station graph: {e}")))?;
    let series = Series {
        steps,
        nodes,
        values,
        observed,
    };
    windowed("us-weather", &series, graph, cfg)
}

/// Loads `pems04` / `pems08` from `dir` (`PEMS04.npz` and `PEMS04.csv`).
pub(crate) fn load_pems(name: &str, dir: &Path, cfg: &DataConfig) -> Result<Dataset, DataError> {
    let stem = name.to_uppercase();
    let npz_path = dir.join(format!("{stem}.npz"));
    let csv_path = dir.join(format!("{stem}.csv"));
    let bytes = std::fs::read(&npz_path).map_err(|e| DataError::io(&npz_path, e))?;
    let shown = npz_path.display().to_string();
    let mut npz = Npz::new(Cursor::new(bytes), &shown)?;
    let (data, shape) = read_numeric(&mut npz, "data")?;
    let [steps, nodes, channels] = <[usize; 3]>::try_from(shape.as_slice()).map_err(|_| {
        DataError::format(
            &npz_path,
            format!("member data.npy has shape {shape:?}, expected (T, N, channels)"),
        )
    })?;
    if channels == 0 {
        return Err(DataError::format(
            &npz_path,
            "member data.npy has no channel",
        ));
    }
    let values: Vec<f32> = data.iter().step_by(channels).map(|&v| v as f32).collect();
    let observed = values.iter().map(|v| v.is_finite() && *v != 0.0).collect();
    let text = std::fs::read_to_string(&csv_path).map_err(|e| DataError::io(&csv_path, e))?;
    let graph = distance_graph(&text, nodes).map_err(|m| DataError::format(&csv_path, m))?;
    let series = Series {
        steps,
        nodes,
        values,
        observed,
    };
    windowed(name, &series, graph, cfg)
}

/// Loads `metr-la` / `pems-bay` from `dir/{name}.npz` (module docs).
pub(crate) fn load_dcrnn(name: &str, dir: &Path, cfg: &DataConfig) -> Result<Dataset, DataError> {
    let path = dir.join(format!("{name}.npz"));
    let bytes = std::fs::read(&path).map_err(|e| not_converted(&path, e, name))?;
    let mut npz = Npz::new(Cursor::new(bytes), &path.display().to_string())?;
    let (speed, shape) = read_numeric(&mut npz, "speed")?;
    let [steps, nodes] = <[usize; 2]>::try_from(shape.as_slice()).map_err(|_| {
        DataError::format(
            &path,
            format!("member speed.npy has shape {shape:?}, expected (T, N)"),
        )
    })?;
    let (adjacency, a_shape) = read_numeric(&mut npz, "adjacency")?;
    expect_shape(
        &path.display().to_string(),
        "adjacency",
        &a_shape,
        &[nodes, nodes],
    )?;
    if let Some(bad) = adjacency.iter().find(|w| !(w.is_finite() && **w >= 0.0)) {
        return Err(DataError::format(
            &path,
            format!("member adjacency.npy has weight {bad}; weights must be finite and ≥ 0"),
        ));
    }
    let triples = adjacency
        .chunks_exact(nodes.max(1))
        .enumerate()
        .flat_map(|(i, row)| {
            row.iter()
                .enumerate()
                .filter(move |&(j, &w)| j != i && w != 0.0)
                .map(move |(j, &w)| (i, j, w))
        });
    let graph = RelationGraph::from_triples(nodes, triples)
        .map_err(|e| DataError::format(&path, format!("sensor graph: {e}")))?;
    let values: Vec<f32> = speed.iter().map(|&v| v as f32).collect();
    let observed = values.iter().map(|v| v.is_finite() && *v != 0.0).collect();
    let series = Series {
        steps,
        nodes,
        values,
        observed,
    };
    windowed(name, &series, graph, cfg)
}

/// A missing converted file: say how to make it.
fn not_converted(path: &Path, e: std::io::Error, name: &str) -> DataError {
    if e.kind() != std::io::ErrorKind::NotFound {
        return DataError::io(path, e);
    }
    let (h5, pkl) = if name == "metr-la" {
        ("metr-la.h5", "adj_mx.pkl")
    } else {
        ("pems-bay.h5", "adj_mx_bay.pkl")
    };
    DataError::config(
        "data.path",
        format!(
            "{} not found: convert DCRNN's {h5} and {pkl} once with \
             `python3 scripts/traffic_npz.py {h5} {pkl} {}`",
            path.display(),
            path.display()
        ),
    )
}

/// PeMS files store `data` as float64 or float32 depending on the release.
fn read_numeric<R: Read + Seek>(
    npz: &mut Npz<R>,
    name: &str,
) -> Result<(Vec<f64>, Vec<usize>), DataError> {
    match npz.array::<f64>(name) {
        Ok(v) => Ok(v),
        Err(_) => npz
            .array::<f32>(name)
            .map(|(v, s)| (v.into_iter().map(f64::from).collect(), s)),
    }
}

/// The symmetric Gaussian-kernel graph of a `from,to,cost` distance list.
fn distance_graph(text: &str, nodes: usize) -> Result<RelationGraph, String> {
    let mut edges = Vec::new();
    for (line_no, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || (line_no == 0 && line.starts_with(|c: char| c.is_alphabetic())) {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let parsed = (f.len() == 3)
            .then(|| {
                Some((
                    f[0].parse::<usize>().ok()?,
                    f[1].parse::<usize>().ok()?,
                    f[2].parse::<f64>().ok()?,
                ))
            })
            .flatten();
        let Some((a, b, d)) = parsed else {
            return Err(format!(
                "line {}: expected `from,to,cost`, got {line:?}",
                line_no + 1
            ));
        };
        if a >= nodes || b >= nodes {
            return Err(format!(
                "line {}: sensor {} out of range (the series has {nodes})",
                line_no + 1,
                a.max(b)
            ));
        }
        if !(d.is_finite() && d >= 0.0) {
            return Err(format!(
                "line {}: distance {d} must be finite and ≥ 0",
                line_no + 1
            ));
        }
        edges.push((a, b, d));
    }
    if edges.is_empty() {
        return Err("no edges listed".into());
    }
    let mean = edges.iter().map(|e| e.2).sum::<f64>() / edges.len() as f64;
    let var = edges.iter().map(|e| (e.2 - mean).powi(2)).sum::<f64>() / edges.len() as f64;
    let sigma = if var > 0.0 { var.sqrt() } else { 1.0 };
    // One weight per road: an edge listed in both directions counts once.
    let mut roads = std::collections::BTreeMap::new();
    for &(a, b, d) in edges.iter().filter(|e| e.0 != e.1) {
        roads.entry((a.min(b), a.max(b))).or_insert(d);
    }
    let triples: Vec<_> = roads
        .into_iter()
        .flat_map(|((a, b), d)| {
            let w = (-(d / sigma).powi(2)).exp();
            [(a, b, w), (b, a, w)]
        })
        .collect();
    RelationGraph::from_triples(nodes, triples).map_err(|e| e.to_string())
}

/// Windows, chronological splits and per-station scaling (module docs).
fn windowed(
    name: &str,
    s: &Series,
    graph: RelationGraph,
    cfg: &DataConfig,
) -> Result<Dataset, DataError> {
    let (input, horizon) = (cfg.input_steps, cfg.horizon);
    if input == 0 {
        return Err(DataError::config("data.input_steps", "must be at least 1"));
    }
    if horizon == 0 {
        return Err(DataError::config("data.horizon", "must be at least 1"));
    }
    if cfg.max_train_samples.is_some() {
        return Err(DataError::config(
            "data.max_train_samples",
            format!(
                "{name} is a forecasting dataset: every station's series is used; remove the key"
            ),
        ));
    }
    let windows = (s.steps + 1).saturating_sub(input + horizon);
    let n_train = (TRAIN_SHARE * windows as f64).floor() as usize;
    let n_val = (VAL_SHARE * windows as f64).floor() as usize;
    if n_train == 0 || n_val == 0 || windows - n_train - n_val == 0 {
        return Err(DataError::config(
            "data.input_steps",
            format!(
                "{name} has {} steps: input_steps = {input} plus horizon = {horizon} leave {windows} windows, \
                 too few for a 70/10/20 train/validation/test split",
                s.steps
            ),
        ));
    }
    let covered = n_train + input + horizon - 1;
    let mut scales = Vec::with_capacity(s.nodes);
    let (mut train, mut test) = (Split::forecasting(horizon), Split::forecasting(horizon));
    let mut clients = Vec::with_capacity(s.nodes);
    for node in 0..s.nodes {
        let at = |t: usize| t * s.nodes + node;
        let seen: Vec<f64> = (0..covered)
            .filter(|&t| s.observed[at(t)])
            .map(|t| f64::from(s.values[at(t)]))
            .collect();
        let mean = seen.iter().sum::<f64>() / seen.len().max(1) as f64;
        let var = seen.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / seen.len().max(1) as f64;
        let std = if var.sqrt() < 1e-6 { 1.0 } else { var.sqrt() };
        let z = |t: usize| {
            s.observed[at(t)].then(|| ((f64::from(s.values[at(t)]) - mean) / std) as f32)
        };
        let push = |split: &mut Split, w: usize| {
            split
                .features
                .extend((w..w + input).map(|t| z(t).unwrap_or(0.0)));
            split
                .targets
                .extend((w + input..w + input + horizon).map(|t| z(t).unwrap_or(f32::NAN)));
            split.len() - 1
        };
        let mut client = NaturalClient::default();
        for w in 0..windows {
            if w < n_train {
                client.train.push(push(&mut train, w));
            } else if w < n_train + n_val {
                client.val.push(push(&mut train, w));
            } else {
                client.test.push(push(&mut test, w));
            }
        }
        clients.push(client);
        scales.push(TargetScale {
            mean: mean as f32,
            std: std as f32,
        });
    }
    Ok(Dataset {
        name: name.to_string(),
        num_classes: 0,
        feature_shape: vec![input, 1],
        train,
        test,
        natural_clients: Some(clients),
        task: Task::Forecasting { horizon },
        relation_graph: Some(graph),
        target_scales: Some(scales),
        input: crate::InputKind::Dense,
    })
}

/// The `us-weather` loader on the bytes of an `.npz`, for the fuzz targets:
/// every member is parsed and checked, then windowed as a real load is.
#[cfg(feature = "fuzzing")]
pub(crate) fn check_npz(bytes: &[u8]) -> Result<Dataset, DataError> {
    us_weather_from(
        Cursor::new(bytes),
        crate::fuzzing::INPUT,
        &DataConfig::default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> DataConfig {
        DataConfig {
            dataset: "us-weather".into(),
            ..DataConfig::default()
        }
    }

    /// Raw series and mask straight from the bundled archive.
    fn raw() -> (Vec<f32>, Vec<bool>) {
        let mut npz = Npz::new(Cursor::new(US_WEATHER_NPZ), "t").unwrap();
        let (v, _) = npz.array::<f32>("daily_temperature_midrange_c").unwrap();
        let (m, _) = npz.array::<bool>("observation_mask").unwrap();
        (v, m)
    }

    #[test]
    fn us_weather_windows_splits_and_graph() {
        let ds = load_us_weather(None, &cfg()).unwrap();
        assert_eq!(ds.task, Task::Forecasting { horizon: 3 });
        assert_eq!(ds.feature_shape, vec![12, 1]);
        let nat = ds.natural_clients.as_ref().unwrap();
        assert_eq!(nat.len(), 144);
        // 365 − 12 − 3 + 1 = 351 windows: 245 train, 35 validation, 71 test.
        for c in nat {
            assert_eq!((c.train.len(), c.val.len(), c.test.len()), (245, 35, 71));
        }
        assert_eq!(ds.train.len(), 144 * 280);
        assert_eq!(ds.test.len(), 144 * 71);
        let g = ds.relation_graph.as_ref().unwrap();
        assert_eq!(g.n(), 144);
        for i in 0..144 {
            let nbrs: Vec<usize> = g.row(i).filter(|&(j, _)| j != i).map(|(j, _)| j).collect();
            assert!(nbrs.len() >= 6, "station {i} has {} neighbours", nbrs.len());
            for j in nbrs {
                assert!(g.get(j, i) > 0.0, "edge {i}→{j} has no reverse");
            }
        }
    }

    #[test]
    fn first_window_by_hand_and_no_leakage_in_the_scaling() {
        let ds = load_us_weather(None, &cfg()).unwrap();
        let (v, m) = raw();
        let scale = ds.target_scales.as_ref().unwrap()[0];
        // Station 0's statistics over days 0..259 (245 train windows + 14).
        let seen: Vec<f64> = (0..259)
            .filter(|&t| m[t * 144])
            .map(|t| f64::from(v[t * 144]))
            .collect();
        let mean = seen.iter().sum::<f64>() / seen.len() as f64;
        assert!((f64::from(scale.mean) - mean).abs() < 1e-4);
        let first = ds.natural_clients.as_ref().unwrap()[0].train[0];
        let x = ds.train.row(first, 12);
        for (t, &xv) in x.iter().enumerate() {
            let want = if m[t * 144] {
                (v[t * 144] - scale.mean) / scale.std
            } else {
                0.0
            };
            assert!((xv - want).abs() < 1e-5, "day {t}: {xv} vs {want}");
        }
        let y = &ds.train.targets[first * 3..first * 3 + 3];
        for (k, &yv) in y.iter().enumerate() {
            let t = 12 + k;
            if m[t * 144] {
                assert!((yv - (v[t * 144] - scale.mean) / scale.std).abs() < 1e-5);
            } else {
                assert!(yv.is_nan());
            }
        }
        // Over the covered training days the z-scores have mean 0, std 1.
        let z: Vec<f64> = seen
            .iter()
            .map(|x| (x - mean) / f64::from(scale.std))
            .collect();
        let zm = z.iter().sum::<f64>() / z.len() as f64;
        let zs = (z.iter().map(|a| (a - zm).powi(2)).sum::<f64>() / z.len() as f64).sqrt();
        assert!(zm.abs() < 1e-6 && (zs - 1.0).abs() < 1e-6);
    }

    #[test]
    fn masked_targets_are_nan_exactly_where_unobserved() {
        let ds = load_us_weather(None, &cfg()).unwrap();
        let (v, m) = raw();
        let nat = ds.natural_clients.as_ref().unwrap();
        let mut nan_targets = 0;
        for (node, c) in nat.iter().enumerate() {
            for (w, &row) in c.train.iter().enumerate() {
                for k in 0..3 {
                    let t = w + 12 + k;
                    let observed = m[t * 144 + node] && v[t * 144 + node].is_finite();
                    assert_eq!(ds.train.targets[row * 3 + k].is_nan(), !observed);
                    nan_targets += usize::from(!observed);
                }
            }
        }
        assert!(nan_targets > 0, "the 2025 data has gaps");
    }

    #[test]
    fn bad_archives_and_settings_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let truncated = dir.path().join("t.npz");
        std::fs::write(&truncated, &US_WEATHER_NPZ[..5000]).unwrap();
        let err = load_us_weather(Some(&truncated), &cfg())
            .unwrap_err()
            .to_string();
        assert!(err.contains("t.npz"), "{err}");
        let too_long = DataConfig {
            input_steps: 400,
            ..cfg()
        };
        let err = load_us_weather(None, &too_long).unwrap_err().to_string();
        assert!(err.contains("data.input_steps"), "{err}");
        // An archive without the temperature member.
        let mut buf = Cursor::new(Vec::new());
        {
            let mut w = zip::ZipWriter::new(&mut buf);
            w.start_file(
                "observation_mask.npy",
                zip::write::SimpleFileOptions::default(),
            )
            .unwrap();
            std::io::Write::write_all(&mut w, b"junk").unwrap();
            w.finish().unwrap();
        }
        let p = dir.path().join("m.npz");
        std::fs::write(&p, buf.into_inner()).unwrap();
        let err = load_us_weather(Some(&p), &cfg()).unwrap_err().to_string();
        assert!(
            err.contains("daily_temperature_midrange_c.npy: missing"),
            "{err}"
        );
    }

    #[test]
    fn pems_fixture_graph_by_hand() {
        let dir = tempfile::tempdir().unwrap();
        // T = 60, N = 4, 3 channels; flow of sensor n at t = 10n + t, with
        // one zero reading (missing) at t = 20 for sensor 1.
        let (t_len, n) = (60usize, 4usize);
        let mut data = Vec::new();
        for t in 0..t_len {
            for s in 0..n {
                let flow = if (s, t) == (1, 20) {
                    0.0
                } else {
                    (10 * s + t) as f64
                };
                data.extend([flow, 0.5, 60.0]);
            }
        }
        let mut npy = Vec::new();
        {
            use npyz::WriterBuilder;
            let mut w = npyz::WriteOptions::<f64>::new()
                .default_dtype()
                .shape(&[t_len as u64, n as u64, 3])
                .writer(&mut npy)
                .begin_nd()
                .unwrap();
            w.extend(data.iter().copied()).unwrap();
            w.finish().unwrap();
        }
        let mut buf = Cursor::new(Vec::new());
        {
            let mut z = zip::ZipWriter::new(&mut buf);
            z.start_file("data.npy", zip::write::SimpleFileOptions::default())
                .unwrap();
            std::io::Write::write_all(&mut z, &npy).unwrap();
            z.finish().unwrap();
        }
        std::fs::write(dir.path().join("PEMS04.npz"), buf.into_inner()).unwrap();
        let cfg = DataConfig {
            dataset: "pems04".into(),
            ..DataConfig::default()
        };
        let err = load_pems("pems04", dir.path(), &cfg)
            .unwrap_err()
            .to_string();
        assert!(err.contains("PEMS04.csv"), "{err}");
        // Distances 1 and 3: mean 2, σ = 1 → weights e^−1 and e^−9.
        std::fs::write(
            dir.path().join("PEMS04.csv"),
            "from,to,cost\n0,1,1.0\n2,3,3.0\n",
        )
        .unwrap();
        let ds = load_pems("pems04", dir.path(), &cfg).unwrap();
        let g = ds.relation_graph.as_ref().unwrap();
        assert!((g.get(0, 1) - (-1.0f64).exp()).abs() < 1e-12);
        assert!((g.get(3, 2) - (-9.0f64).exp()).abs() < 1e-12);
        assert_eq!(g.get(0, 2), 0.0);
        // 60 − 12 − 3 + 1 = 46 windows: 32 / 4 / 10.
        let c = &ds.natural_clients.as_ref().unwrap()[1];
        assert_eq!((c.train.len(), c.val.len(), c.test.len()), (32, 4, 10));
        // Window 8 of sensor 1 targets t = 20..22: the zero reading is masked.
        assert!(ds.train.targets[c.train[8] * 3].is_nan());
        assert!(!ds.train.targets[c.train[8] * 3 + 1].is_nan());
    }

    /// An `.npz` of `(name, f64 array, shape)` members, as numpy writes them.
    fn npz_of(members: &[(&str, &[f64], &[u64])]) -> Vec<u8> {
        use npyz::WriterBuilder;
        let mut buf = Cursor::new(Vec::new());
        {
            let mut z = zip::ZipWriter::new(&mut buf);
            for (name, data, shape) in members {
                let mut npy = Vec::new();
                let mut w = npyz::WriteOptions::<f64>::new()
                    .default_dtype()
                    .shape(shape)
                    .writer(&mut npy)
                    .begin_nd()
                    .unwrap();
                w.extend(data.iter().copied()).unwrap();
                w.finish().unwrap();
                z.start_file(
                    format!("{name}.npy"),
                    zip::write::SimpleFileOptions::default(),
                )
                .unwrap();
                std::io::Write::write_all(&mut z, &npy).unwrap();
            }
            z.finish().unwrap();
        }
        buf.into_inner()
    }

    #[test]
    fn metr_la_fixture_keeps_dcrnns_directed_graph() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = DataConfig {
            dataset: "metr-la".into(),
            ..DataConfig::default()
        };
        let err = load_dcrnn("metr-la", dir.path(), &cfg)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("scripts/traffic_npz.py metr-la.h5 adj_mx.pkl"),
            "{err}"
        );
        // T = 40, N = 3: speed of sensor n at t = 50 + n + t, one 0 reading
        // (missing) for sensor 2 at t = 20.
        let (t_len, n) = (40usize, 3usize);
        let speed: Vec<f64> = (0..t_len)
            .flat_map(|t| {
                (0..n).map(move |s| {
                    if (s, t) == (2, 20) {
                        0.0
                    } else {
                        (50 + s + t) as f64
                    }
                })
            })
            .collect();
        // DCRNN's matrix: ones on the diagonal, one road each way with
        // different weights, one road one way only.
        let adjacency = [1.0, 0.7, 0.0, 0.2, 1.0, 0.9, 0.0, 0.0, 1.0];
        let write = |adj: &[f64], shape: &[u64]| {
            let bytes = npz_of(&[
                ("speed", &speed, &[t_len as u64, n as u64]),
                ("adjacency", adj, shape),
            ]);
            std::fs::write(dir.path().join("metr-la.npz"), bytes).unwrap();
        };
        write(&adjacency, &[3, 3]);
        let ds = load_dcrnn("metr-la", dir.path(), &cfg).unwrap();
        let g = ds.relation_graph.as_ref().unwrap();
        assert_eq!((g.get(0, 1), g.get(1, 0), g.get(1, 2)), (0.7, 0.2, 0.9));
        assert_eq!((g.get(2, 1), g.get(0, 0), g.get(0, 2)), (0.0, 0.0, 0.0));
        // 40 − 12 − 3 + 1 = 26 windows: 18 / 2 / 6 per sensor.
        let c = &ds.natural_clients.as_ref().unwrap()[2];
        assert_eq!((c.train.len(), c.val.len(), c.test.len()), (18, 2, 6));
        // Window 8 of sensor 2 targets t = 20..22: the zero speed is masked.
        assert!(ds.train.targets[c.train[8] * 3].is_nan());
        assert!(!ds.train.targets[c.train[8] * 3 + 1].is_nan());

        write(&adjacency[..4], &[2, 2]);
        let err = load_dcrnn("metr-la", dir.path(), &cfg)
            .unwrap_err()
            .to_string();
        assert!(err.contains("adjacency"), "{err}");
        let mut negative = adjacency;
        negative[1] = -0.5;
        write(&negative, &[3, 3]);
        let err = load_dcrnn("metr-la", dir.path(), &cfg)
            .unwrap_err()
            .to_string();
        assert!(err.contains("-0.5") && err.contains("≥ 0"), "{err}");
    }

    #[test]
    fn only_the_natural_partition_with_one_client_per_station() {
        use crate::{PartitionConfig, PartitionKind, partition};
        let ds = load_us_weather(None, &cfg()).unwrap();
        let natural = PartitionConfig {
            kind: PartitionKind::Natural,
            ..PartitionConfig::default()
        };
        let p = partition(&ds, &natural, 144, 1).unwrap();
        let c = &p.clients[7];
        // Chronological: validation windows follow the training ones.
        assert_eq!(c.val.len(), 35);
        assert!(c.train.iter().max() < c.val.iter().min());
        assert_eq!(p.train_sizes()[7], 280);
        let err = partition(&ds, &natural, 10, 1).unwrap_err().to_string();
        assert!(err.contains("144 natural clients"), "{err}");
        let dirichlet = PartitionConfig {
            kind: PartitionKind::Dirichlet,
            ..PartitionConfig::default()
        };
        let err = partition(&ds, &dirichlet, 144, 1).unwrap_err().to_string();
        assert!(err.contains("must be \"natural\""), "{err}");
        // Label counts of a forecasting partition are empty, not a panic.
        let report = p.label_counts(&ds);
        assert!(report.clients[0].train.is_empty());
        assert_eq!(report.clients[0].samples, [245, 35, 71]);
    }
}
