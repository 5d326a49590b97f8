//! Small text helpers: HTML escaping and human-readable numbers.

/// Escapes `&`, `<`, `>`, `"` and `'` so the text is safe both as element
/// content and inside a quoted attribute value.
pub fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + s.len() / 8);
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A fraction in [0, 1] as a percentage with two decimals (`0.9125` →
/// `"91.25%"`); `None` or a non-finite value gives an em dash.
pub fn percent(v: Option<f64>) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{:.2}%", x * 100.0),
        _ => "—".to_string(),
    }
}

/// A byte count in binary units (`1536` → `"1.50 KiB"`).
pub fn human_bytes(bytes: f64) -> String {
    if !bytes.is_finite() || bytes < 0.0 {
        return "—".to_string();
    }
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{} B", v.round() as u64)
    } else if v < 10.0 {
        format!("{v:.2} {}", UNITS[unit])
    } else if v < 100.0 {
        format!("{v:.1} {}", UNITS[unit])
    } else {
        format!("{v:.0} {}", UNITS[unit])
    }
}

/// A duration in seconds as `"12.3 s"`, `"4m 05s"` or `"2h 03m"`.
pub fn human_seconds(secs: f64) -> String {
    if !secs.is_finite() || secs < 0.0 {
        return "—".to_string();
    }
    if secs < 60.0 {
        return format!("{secs:.1} s");
    }
    let total = secs.round() as u64;
    if total < 3600 {
        format!("{}m {:02}s", total / 60, total % 60)
    } else {
        format!("{}h {:02}m", total / 3600, (total % 3600) / 60)
    }
}

/// A general number with about four significant digits, without trailing
/// noise (`0.123456` → `"0.1235"`, `1234.5` → `"1234.5"`).
pub fn number(v: Option<f64>) -> String {
    match v {
        Some(x) if x.is_finite() => {
            let a = x.abs();
            if a == 0.0 {
                "0".to_string()
            } else if a >= 1000.0 {
                format!("{x:.1}")
            } else if a >= 1.0 {
                format!("{x:.3}")
            } else {
                let decimals = (-(a.log10().floor()) as usize + 3).min(12);
                format!("{x:.decimals$}")
            }
        }
        _ => "—".to_string(),
    }
}

/// The unit of a forecasting dataset's errors (MAE, RMSE), when known:
/// `°C` for `us-weather`, vehicles per 5 minutes for the PeMS flow sets,
/// `mph` for the METR-LA / PEMS-BAY speed sets.
pub fn error_unit(dataset: &str) -> Option<&'static str> {
    match dataset {
        "us-weather" => Some("°C"),
        "pems04" | "pems08" => Some("vehicles/5 min"),
        "metr-la" | "pems-bay" => Some("mph"),
        _ => None,
    }
}

/// `number(v)` followed by `unit` (nothing added for `—`).
pub fn with_unit(v: Option<f64>, unit: Option<&str>) -> String {
    let n = number(v);
    match unit {
        Some(u) if n != "—" => format!("{n} {u}"),
        _ => n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_all_specials() {
        assert_eq!(
            escape_html(r#"<a href="x">'&'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
    }

    #[test]
    fn formats_numbers() {
        assert_eq!(percent(Some(0.9125)), "91.25%");
        assert_eq!(percent(None), "—");
        assert_eq!(percent(Some(f64::NAN)), "—");
        assert_eq!(human_bytes(512.0), "512 B");
        assert_eq!(human_bytes(1536.0), "1.50 KiB");
        assert_eq!(human_bytes(3.0 * 1024.0 * 1024.0 * 1024.0), "3.00 GiB");
        assert_eq!(human_bytes(150.0 * 1024.0 * 1024.0), "150 MiB");
        assert_eq!(human_seconds(12.34), "12.3 s");
        assert_eq!(human_seconds(245.0), "4m 05s");
        assert_eq!(human_seconds(7380.0), "2h 03m");
        assert_eq!(number(Some(0.123456)), "0.1235");
        assert_eq!(number(Some(2.5)), "2.500");
        assert_eq!(number(None), "—");
    }
}
