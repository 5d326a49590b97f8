//! Error messages in the user's words: "did you mean …" for a mistyped
//! name or key (by edit distance), and serde's type names ("expected struct
//! TrainSection", "expected usize") said as a person would.

/// The candidate closest to `word` by edit distance (a transposition counts
/// once), if it is close enough to be a typo (about a third of the longer
/// word's letters may differ, at least one), case ignored.
pub fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let w = word.to_lowercase();
    candidates
        .into_iter()
        .map(|c| (strsim::damerau_levenshtein(&w, &c.to_lowercase()), c))
        .filter(|(d, c)| *d <= (w.chars().count().max(c.chars().count()).div_ceil(3)).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// "unknown `what` `word`; did you mean `X`?", or with the known names
/// when none is close.
pub fn unknown_name(what: &str, word: &str, known: &[&str]) -> String {
    match did_you_mean(word, known.iter().copied()) {
        Some(s) => format!("unknown {what} `{word}`; did you mean `{s}`?"),
        None => format!("unknown {what} `{word}`; known: {}", known.join(", ")),
    }
}

/// The names between backticks in `text`.
fn quoted(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// Rewrites a deserializer message about the key at dotted `path` (the
/// path ends with the unknown key for an unknown field) in the user's
/// words.
pub fn explain(path: &str, message: &str) -> String {
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let (word, tail) = rest.split_once('`').unwrap_or((rest, ""));
        let known = quoted(tail);
        let prefix = path
            .strip_suffix(word)
            .map_or(String::new(), |p| p.to_string());
        return match did_you_mean(word, known.iter().copied()) {
            Some(s) => format!("unknown key; did you mean `{prefix}{s}`?"),
            None if known.is_empty() => "unknown key; this table takes no keys".into(),
            None => format!("unknown key; the keys here are {}", known.join(", ")),
        };
    }
    if let Some(rest) = message.strip_prefix("unknown variant `") {
        let (word, tail) = rest.split_once('`').unwrap_or((rest, ""));
        return unknown_name("value", word, &quoted(tail));
    }
    for lead in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = message.strip_prefix(lead)
            && let Some((got, want)) = rest.rsplit_once(", expected ")
        {
            return format!("expected {}, got {got}", expected(want, path));
        }
    }
    message.to_string()
}

/// serde's "expected …" in words.
fn expected(want: &str, path: &str) -> String {
    let section = path.rsplit('.').next().unwrap_or(path);
    match want.trim() {
        w if w.starts_with("struct ") || w == "a map" => {
            format!("a table (a `[{section}]` section)")
        }
        "usize" | "u64" | "u32" | "u16" | "u8" => "a whole number ≥ 0".into(),
        "isize" | "i64" | "i32" | "i16" | "i8" => "a whole number".into(),
        "f64" | "f32" => "a number".into(),
        "a boolean" => "true or false".into(),
        "a sequence" => "a list".into(),
        w if w.starts_with("enum ") => "one of the names `fedweave list` shows".into(),
        w => w.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_find_their_names() {
        let algos = ["fedavg", "pfedgraph", "fedprox", "local"];
        assert_eq!(did_you_mean("pfedgrph", algos), Some("pfedgraph"));
        assert_eq!(did_you_mean("FedAvg", algos), Some("fedavg"));
        assert_eq!(did_you_mean("zzzzzz", algos), None);
        assert_eq!(did_you_mean("lrr", ["lr", "momentum"]), Some("lr"));
        assert_eq!(did_you_mean("mpl", ["mlp", "cnn"]), Some("mlp"));
    }

    #[test]
    fn serde_messages_read_as_words() {
        assert_eq!(
            explain(
                "train.lrr",
                "unknown field `lrr`, expected one of `lr`, `momentum`"
            ),
            "unknown key; did you mean `train.lr`?"
        );
        assert_eq!(
            explain(
                "rouns",
                "unknown field `rouns`, expected `seed` or `rounds`"
            ),
            "unknown key; did you mean `rounds`?"
        );
        assert_eq!(
            explain(
                "train",
                "invalid type: integer `5`, expected struct TrainSection"
            ),
            "expected a table (a `[train]` section), got integer `5`"
        );
        assert_eq!(
            explain("rounds", "invalid type: string \"many\", expected usize"),
            "expected a whole number ≥ 0, got string \"many\""
        );
        assert_eq!(
            explain(
                "model.kind",
                "unknown variant `mpl`, expected one of `mlp`, `cnn`"
            ),
            "unknown value `mpl`; did you mean `mlp`?"
        );
    }
}
