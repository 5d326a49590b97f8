//! MovieLens-100K ratings from GroupLens' `ml-100k/u.data`: one rating per
//! line, `user \t item \t rating \t timestamp` (ids from 1, ratings 1–5,
//! Unix seconds). `u.item` / `u.user` are not needed. `data.path` is the
//! `ml-100k` folder or its parent.
//!
//! - **Task**: [`Task::Regression`] with one target, the rating; features
//!   are `(user id − 1, item id − 1)` as f32, [`InputKind::Categorical`] with
//!   cardinalities (largest user id, largest item id) of the file.
//! - **Clients**: one natural client per user, by ascending user id;
//!   `data.users = N` keeps the first N users (an error when there are
//!   fewer).
//! - **Split**: per user, chronologically (by timestamp, ties by item id):
//!   the oldest 70 % train, the next 10 % validation, the newest 20 % test —
//!   `n_test = max(1, round(0.2·n))`, `n_val = max(1, round(0.1·n))`, the rest
//!   train; a user needs at least 3 ratings. Train and validation samples
//!   form the training pool (the natural client's `val` indexes it), test
//!   samples the test pool. Predicting a user's later ratings from earlier
//!   ones avoids leaking the future.
//! - **Scale**: with `data.normalize` (default) ratings are z-scored with
//!   the mean and standard deviation of all training (not validation)
//!   ratings, and every client's [`crate::TargetScale`] is that pair, so
//!   errors are reported in stars; without it they stay raw (scale 0, 1).
//!
//! `data.max_train_samples` is rejected (its subsample is stratified by
//! class and would break the per-user split).

use std::path::Path;

use crate::files::{locate, need_path, not_found, read};
use crate::{DataConfig, DataError, Dataset, InputKind, NaturalClient, Split, TargetScale, Task};

struct Rating {
    user: u32,
    item: u32,
    rating: f32,
    time: u64,
}

/// Loads `movielens-100k` from `cfg.path`.
pub(crate) fn load(cfg: &DataConfig) -> Result<Dataset, DataError> {
    if cfg.max_train_samples.is_some() {
        return Err(DataError::config(
            "data.max_train_samples",
            "is for classification datasets; movielens-100k keeps every user's ratings (use \
             data.users to take fewer users)",
        ));
    }
    if cfg.users == Some(0) {
        return Err(DataError::config("data.users", "must be at least 1"));
    }
    let root = need_path(cfg, "the ml-100k folder holding u.data, or its parent")?;
    let dir = locate(root, &["ml-100k"], |d| d.join("u.data").is_file()).ok_or_else(|| {
        not_found(
            root.join("u.data"),
            format!(
                "no u.data in {} or {}",
                root.display(),
                root.join("ml-100k").display()
            ),
        )
    })?;
    let path = dir.join("u.data");
    let ratings = parse(&path)?;
    let max_user = ratings.iter().map(|r| r.user).max().unwrap_or(0) as usize;
    let max_item = ratings.iter().map(|r| r.item).max().unwrap_or(0) as usize;

    let mut by_user: Vec<Vec<&Rating>> = vec![Vec::new(); max_user + 1];
    for r in &ratings {
        by_user[r.user as usize].push(r);
    }
    let mut users: Vec<Vec<&Rating>> = by_user.into_iter().filter(|v| !v.is_empty()).collect();
    if let Some(n) = cfg.users {
        if users.len() < n {
            return Err(DataError::config(
                "data.users",
                format!(
                    "{} holds ratings of {} users but data.users = {n}",
                    path.display(),
                    users.len()
                ),
            ));
        }
        users.truncate(n);
    }

    let mut train = Split::forecasting(1);
    let mut test = Split::forecasting(1);
    let mut clients = Vec::with_capacity(users.len());
    let mut is_val = Vec::new();
    for rs in &mut users {
        rs.sort_by_key(|r| (r.time, r.item));
        let n = rs.len();
        if n < 3 {
            return Err(DataError::format(
                &path,
                format!(
                    "user {} has {n} rating(s); each user needs at least 3 (train, validation, \
                     test)",
                    rs[0].user
                ),
            ));
        }
        let n_test = ((0.2 * n as f64).round() as usize).max(1);
        let n_val = ((0.1 * n as f64).round() as usize).max(1);
        let n_train = n - n_test - n_val;
        let mut c = NaturalClient::default();
        for (k, r) in rs.iter().enumerate() {
            let (split, list) = if k < n_train + n_val {
                let list = if k < n_train {
                    &mut c.train
                } else {
                    &mut c.val
                };
                is_val.push(k >= n_train);
                (&mut train, list)
            } else {
                (&mut test, &mut c.test)
            };
            list.push(split.targets.len());
            split
                .features
                .extend([(r.user - 1) as f32, (r.item - 1) as f32]);
            split.targets.push(r.rating);
        }
        clients.push(c);
    }

    let scale = if cfg.normalize {
        let fit: Vec<f64> = train
            .targets
            .iter()
            .zip(&is_val)
            .filter(|(_, v)| !**v)
            .map(|(&t, _)| f64::from(t))
            .collect();
        let mean = fit.iter().sum::<f64>() / fit.len() as f64;
        let var = fit.iter().map(|t| (t - mean).powi(2)).sum::<f64>() / fit.len() as f64;
        let std = var.sqrt().max(1e-6);
        for t in train.targets.iter_mut().chain(test.targets.iter_mut()) {
            *t = ((f64::from(*t) - mean) / std) as f32;
        }
        TargetScale {
            mean: mean as f32,
            std: std as f32,
        }
    } else {
        TargetScale {
            mean: 0.0,
            std: 1.0,
        }
    };
    Ok(Dataset {
        name: "movielens-100k".to_string(),
        num_classes: 0,
        feature_shape: vec![2],
        train,
        test,
        target_scales: Some(vec![scale; clients.len()]),
        natural_clients: Some(clients),
        task: Task::Regression { targets: 1 },
        relation_graph: None,
        input: InputKind::Categorical {
            cardinalities: vec![max_user, max_item],
        },
    })
}

/// Reads every rating of `u.data`.
fn parse(path: &Path) -> Result<Vec<Rating>, DataError> {
    let bytes = read(path)?;
    let text = std::str::from_utf8(&bytes)
        .map_err(|e| DataError::format(path, format!("not a text file: {e}")))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        let bad = |m: String| DataError::format(path, format!("line {}: {m}", i + 1));
        let fields: Vec<&str> = line.split('\t').collect();
        let [user, item, rating, time] = fields[..] else {
            return Err(bad(format!(
                "expected 4 tab-separated fields (user, item, rating, timestamp), got {}: {line:?}",
                fields.len()
            )));
        };
        let id = |s: &str, what: &str| match s.trim().parse::<u32>() {
            Ok(v) if v >= 1 => Ok(v),
            _ => Err(bad(format!("{what} id {s:?} is not a positive integer"))),
        };
        let (user, item) = (id(user, "user")?, id(item, "item")?);
        let rating = match rating.trim().parse::<f32>() {
            Ok(r) if (1.0..=5.0).contains(&r) => r,
            _ => return Err(bad(format!("rating {rating:?} is not a number in 1..=5"))),
        };
        let time = time
            .trim()
            .parse::<u64>()
            .map_err(|_| bad(format!("timestamp {time:?} is not an integer")))?;
        out.push(Rating {
            user,
            item,
            rating,
            time,
        });
    }
    if out.is_empty() {
        return Err(DataError::format(path, "holds no rating"));
    }
    Ok(out)
}
