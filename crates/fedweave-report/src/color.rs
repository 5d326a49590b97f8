//! The sequential colour scale used by every heatmap (white → deep blue).

/// An sRGB colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rgb(pub u8, pub u8, pub u8);

impl Rgb {
    /// `#rrggbb`.
    pub fn hex(self) -> String {
        format!("#{:02x}{:02x}{:02x}", self.0, self.1, self.2)
    }

    /// Relative luminance (WCAG definition) in [0, 1].
    pub fn luminance(self) -> f64 {
        fn lin(c: u8) -> f64 {
            let c = f64::from(c) / 255.0;
            if c <= 0.04045 {
                c / 12.92
            } else {
                ((c + 0.055) / 1.055).powf(2.4)
            }
        }
        0.2126 * lin(self.0) + 0.7152 * lin(self.1) + 0.0722 * lin(self.2)
    }
}

/// Anchors of the scale, evenly spaced over [0, 1]. Every channel is
/// non-increasing and green strictly decreasing, so luminance falls strictly.
const ANCHORS: [(u8, u8, u8); 9] = [
    (0xff, 0xff, 0xff),
    (0xde, 0xeb, 0xf7),
    (0xc6, 0xdb, 0xef),
    (0x9e, 0xca, 0xe1),
    (0x6b, 0xae, 0xd6),
    (0x42, 0x92, 0xc6),
    (0x21, 0x71, 0xb5),
    (0x08, 0x51, 0x9c),
    (0x08, 0x30, 0x6b),
];

/// The colour for `t` in [0, 1] (clamped; NaN counts as 0): white at 0,
/// deep blue at 1, darker as `t` grows.
pub fn scale(t: f64) -> Rgb {
    let t = if t.is_nan() { 0.0 } else { t.clamp(0.0, 1.0) };
    let pos = t * (ANCHORS.len() - 1) as f64;
    let i = (pos.floor() as usize).min(ANCHORS.len() - 2);
    let f = pos - i as f64;
    let (a, b) = (ANCHORS[i], ANCHORS[i + 1]);
    let mix = |x: u8, y: u8| (f64::from(x) + (f64::from(y) - f64::from(x)) * f).round() as u8;
    Rgb(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

/// Whether text drawn over `scale(t)` should be white rather than dark.
pub fn needs_light_text(t: f64) -> bool {
    scale(t).luminance() < 0.3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(scale(0.0), Rgb(0xff, 0xff, 0xff));
        assert_eq!(scale(1.0), Rgb(0x08, 0x30, 0x6b));
        assert_eq!(scale(-3.0), scale(0.0));
        assert_eq!(scale(7.0), scale(1.0));
        assert_eq!(scale(f64::NAN), scale(0.0));
        assert_ne!(scale(1.0).hex(), scale(0.0).hex());
        assert_eq!(scale(0.0).hex(), "#ffffff");
    }

    #[test]
    fn luminance_decreases() {
        // Strictly on a 1/64 grid (8 steps per anchor interval) ...
        let mut prev = f64::INFINITY;
        for k in 0..=64 {
            let l = scale(k as f64 / 64.0).luminance();
            assert!(l < prev, "not strictly monotone at t={}", k as f64 / 64.0);
            prev = l;
        }
        // ... and never increasing on a fine grid (8-bit rounding may tie).
        let mut prev = f64::INFINITY;
        for k in 0..=1000 {
            let l = scale(k as f64 / 1000.0).luminance();
            assert!(l <= prev, "luminance rose at t={}", k as f64 / 1000.0);
            prev = l;
        }
    }

    #[test]
    fn text_contrast() {
        assert!(!needs_light_text(0.0));
        assert!(needs_light_text(1.0));
    }
}
