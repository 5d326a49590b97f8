//! `csv`: every client's own data in its own files, as a deployment has it.
//! `data.path` names one directory per client with `{id}` in it (e.g.
//! `clients/{id}`); each holds `train.csv` and `test.csv`, one sample a row:
//! `label,x1,…,xd` (no header). Each client is a natural client
//! (`partition.kind = "natural"`); validation is carved off its training
//! rows by `partition.val_fraction` as for every dataset.
//!
//! A simulation loads every client's files; a networked client process
//! loads only the clients it hosts (their directories are all its machine
//! has), and the others are marked remote: empty here, never read. The
//! samples of a client are the same either way, so a networked run equals
//! the simulation bit for bit.

use std::path::Path;

use crate::dataset::{Dataset, NaturalClient, Split};
use crate::files::{client_dir, id_template, refuse_subsample};
use crate::{DataConfig, DataError};

/// Loads the `clients` clients' files, or only those in `hosted`.
pub(crate) fn load(
    cfg: &DataConfig,
    clients: usize,
    hosted: Option<&[usize]>,
) -> Result<Dataset, DataError> {
    let template = id_template(cfg)?;
    refuse_subsample(cfg)?;
    let classes = cfg.classes.ok_or_else(|| {
        DataError::config(
            "data.classes",
            "dataset csv needs data.classes (every client must agree on it)",
        )
    })?;
    let mut train = Split::default();
    let mut test = Split::default();
    let mut natural = Vec::with_capacity(clients);
    let mut width = None;
    for id in 0..clients {
        if hosted.is_some_and(|h| !h.contains(&id)) {
            natural.push(NaturalClient {
                remote: true,
                ..NaturalClient::default()
            });
            continue;
        }
        let dir = client_dir(template, id);
        let start = (train.labels.len(), test.labels.len());
        read_csv(&dir.join("train.csv"), classes, &mut width, &mut train)?;
        read_csv(&dir.join("test.csv"), classes, &mut width, &mut test)?;
        natural.push(NaturalClient {
            train: (start.0..train.labels.len()).collect(),
            val: Vec::new(),
            test: (start.1..test.labels.len()).collect(),
            remote: false,
        });
    }
    // A process hosting none of the clients (a server) read no file:
    // `data.shape` is then the shape.
    let read_any = width.is_some();
    let width = width.unwrap_or(0);
    let feature_shape = match &cfg.shape {
        Some(shape) if read_any && shape.iter().product::<usize>() != width => {
            return Err(DataError::config(
                "data.shape",
                format!(
                    "{shape:?} holds {} values but the files have {width} features a row",
                    shape.iter().product::<usize>()
                ),
            ));
        }
        Some(shape) => shape.clone(),
        None => vec![width],
    };
    Ok(Dataset::classification(
        "csv",
        classes,
        feature_shape,
        (train, test),
        Some(natural),
    ))
}

/// Appends the rows of `path` to `split`; every row must have `width`
/// features (the first row read sets it) and a label below `classes`.
fn read_csv(
    path: &Path,
    classes: usize,
    width: &mut Option<usize>,
    split: &mut Split,
) -> Result<(), DataError> {
    let bad = |line: usize, what: String| {
        DataError::config(
            "data.path",
            format!("{} line {line}: {what}", path.display()),
        )
    };
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_path(path)
        .map_err(|e| DataError::io(path, std::io::Error::other(e.to_string())))?;
    for (k, row) in reader.records().enumerate() {
        let row = row.map_err(|e| bad(k + 1, e.to_string()))?;
        let mut cells = row.iter();
        let label: u32 = cells
            .next()
            .and_then(|c| c.trim().parse().ok())
            .ok_or_else(|| bad(k + 1, "the first value must be a class label".into()))?;
        if label as usize >= classes {
            return Err(bad(
                k + 1,
                format!("label {label} but data.classes = {classes}"),
            ));
        }
        let before = split.features.len();
        for c in cells {
            let v: f32 = c
                .trim()
                .parse()
                .map_err(|_| bad(k + 1, format!("`{c}` is not a number")))?;
            if !v.is_finite() {
                return Err(bad(k + 1, format!("`{c}` is not finite")));
            }
            split.features.push(v);
        }
        let got = split.features.len() - before;
        match *width {
            Some(w) if w != got => {
                return Err(bad(k + 1, format!("{got} features, earlier rows have {w}")));
            }
            None if got == 0 => return Err(bad(k + 1, "no features".into())),
            _ => *width = Some(got),
        }
        split.labels.push(label);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, id: usize, train: &str, test: &str) {
        let d = dir.join(id.to_string());
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("train.csv"), train).unwrap();
        std::fs::write(d.join("test.csv"), test).unwrap();
    }

    fn cfg(dir: &Path) -> DataConfig {
        DataConfig {
            dataset: "csv".into(),
            path: Some(dir.join("{id}")),
            classes: Some(3),
            ..DataConfig::default()
        }
    }

    #[test]
    fn each_client_reads_its_own_files_and_remote_ones_stay_empty() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), 0, "0,1,2\n2,3,4\n", "1,5,6\n");
        write(dir.path(), 1, "1,7,8\n", "0,9,10\n2,11,12\n");
        let all = load(&cfg(dir.path()), 2, None).unwrap();
        assert_eq!(all.feature_shape, [2]);
        assert_eq!(all.train.labels, [0, 2, 1]);
        assert_eq!(all.train.features, [1., 2., 3., 4., 7., 8.]);
        let nat = all.natural_clients.as_ref().unwrap();
        assert_eq!(
            (nat[1].train.clone(), nat[1].test.clone()),
            (vec![2], vec![1, 2])
        );
        // Client 1's machine: client 0's directory is not there.
        std::fs::remove_dir_all(dir.path().join("0")).unwrap();
        let one = load(&cfg(dir.path()), 2, Some(&[1])).unwrap();
        let nat = one.natural_clients.unwrap();
        assert!(nat[0].remote && nat[0].train.is_empty());
        assert_eq!(one.train.features, [7., 8.]);
        assert_eq!(one.test.labels, [0, 2]);
    }

    #[test]
    fn bad_files_are_errors_that_name_the_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let err = |train: &str| {
            write(dir.path(), 0, train, "0,1,1\n");
            load(&cfg(dir.path()), 1, None).unwrap_err().to_string()
        };
        assert!(err("0,1,2\n1,3\n").contains("line 2: 1 features, earlier rows have 2"));
        assert!(err("5,1,2\n").contains("label 5 but data.classes = 3"));
        assert!(err("0,1,x\n").contains("`x` is not a number"));
        assert!(err("0,1,NaN\n").contains("not finite"));
        assert!(err("a,1,2\n").contains("class label"));
        let missing = load(&cfg(dir.path()), 2, None).unwrap_err().to_string();
        assert!(missing.contains("train.csv"), "{missing}");
        let mut c = cfg(dir.path());
        c.path = Some(dir.path().join("x"));
        assert!(load(&c, 1, None).unwrap_err().to_string().contains("{id}"));
        c.path = Some(dir.path().join("{id}"));
        c.shape = Some(vec![1, 3]);
        write(dir.path(), 0, "0,1,2\n", "0,1,1\n");
        assert!(
            load(&c, 1, None)
                .unwrap_err()
                .to_string()
                .contains("data.shape")
        );
    }
}
