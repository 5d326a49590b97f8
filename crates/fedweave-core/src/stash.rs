//! Out-of-band storage for the big vectors inside serialized state.
//!
//! Algorithm state (models, momentum buffers, control variates) is ordinary
//! serde data, but a checkpoint should keep its megabytes of `f32` as raw
//! tensors (safetensors), not as decimal text. Fields marked
//! `#[serde(with = "fedweave_core::stash::vector")]` (or [`opt_vector`],
//! [`vectors`], [`opt_vectors`]) serialize normally — as a sequence — unless
//! a [`Stash`] is active on the current thread: then the vector goes into
//! the stash and only its index is written. [`Stash::collect`] and
//! [`Stash::provide`] bracket one serialization or deserialization, so the
//! same state types serve checkpoints (stashed) and network messages
//! (inline) without knowing which.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::cell::RefCell;

thread_local! {
    static ACTIVE: RefCell<Option<Mode>> = const { RefCell::new(None) };
}

enum Mode {
    Collect(Vec<Vec<f32>>),
    Provide(Vec<Option<Vec<f32>>>),
}

/// The vectors taken out of (or put back into) one serialized value.
pub struct Stash;

impl Stash {
    /// Runs `f` (a serialization) with a stash active on this thread and
    /// returns its result with the vectors it stashed, in index order.
    pub fn collect<T>(f: impl FnOnce() -> T) -> (T, Vec<Vec<f32>>) {
        let previous = ACTIVE.with(|a| a.borrow_mut().replace(Mode::Collect(Vec::new())));
        let out = f();
        let taken = ACTIVE.with(|a| std::mem::replace(&mut *a.borrow_mut(), previous));
        match taken {
            Some(Mode::Collect(v)) => (out, v),
            _ => (out, Vec::new()),
        }
    }

    /// Runs `f` (a deserialization) with `vectors` available by index. Each
    /// vector can be taken once; vectors left over are an error, so a state
    /// file that does not match its tensors is never half-read.
    pub fn provide<T, E: std::fmt::Display>(
        vectors: Vec<Vec<f32>>,
        f: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, String> {
        let pool = vectors.into_iter().map(Some).collect();
        let previous = ACTIVE.with(|a| a.borrow_mut().replace(Mode::Provide(pool)));
        let out = f();
        let left = ACTIVE.with(|a| std::mem::replace(&mut *a.borrow_mut(), previous));
        let out = out.map_err(|e| e.to_string())?;
        if let Some(Mode::Provide(pool)) = left {
            let unused = pool.iter().filter(|v| v.is_some()).count();
            if unused > 0 {
                return Err(format!(
                    "{unused} stored vectors are not referenced by the state"
                ));
            }
        }
        Ok(out)
    }
}

/// A stashed vector's reference in the serialized text.
#[derive(Serialize, Deserialize)]
struct Ref {
    #[serde(rename = "$vector")]
    index: usize,
}

fn ser<S: Serializer>(v: &[f32], s: S) -> Result<S::Ok, S::Error> {
    let index = ACTIVE.with(|a| match &mut *a.borrow_mut() {
        Some(Mode::Collect(stash)) => {
            stash.push(v.to_vec());
            Some(stash.len() - 1)
        }
        _ => None,
    });
    match index {
        Some(index) => Ref { index }.serialize(s),
        None => v.serialize(s),
    }
}

fn de<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f32>, D::Error> {
    let providing = ACTIVE.with(|a| matches!(&*a.borrow(), Some(Mode::Provide(_))));
    if !providing {
        return Vec::<f32>::deserialize(d);
    }
    let Ref { index } = Ref::deserialize(d)?;
    ACTIVE.with(|a| match &mut *a.borrow_mut() {
        Some(Mode::Provide(pool)) => pool
            .get_mut(index)
            .and_then(Option::take)
            .ok_or_else(|| D::Error::custom(format!("stored vector {index} missing or reused"))),
        _ => Err(D::Error::custom("no stored vectors")),
    })
}

/// `#[serde(with = "fedweave_core::stash::vector")]` for `Vec<f32>`.
pub mod vector {
    use super::*;

    /// Serializes `v` inline, or into the active stash.
    pub fn serialize<S: Serializer>(v: &[f32], s: S) -> Result<S::Ok, S::Error> {
        ser(v, s)
    }

    /// Reads a vector inline, or from the active stash.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f32>, D::Error> {
        de(d)
    }
}

/// An owned vector read through the stash.
#[derive(Deserialize)]
#[serde(transparent)]
struct Wrapped(#[serde(deserialize_with = "de")] Vec<f32>);

/// A borrowed vector written through the stash (no copy when inline).
struct Out<'a>(&'a [f32]);

impl Serialize for Out<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        ser(self.0, s)
    }
}

/// `#[serde(with = "fedweave_core::stash::opt_vector")]` for `Option<Vec<f32>>`.
pub mod opt_vector {
    use super::*;

    /// Serializes `v` inline, or into the active stash.
    pub fn serialize<S: Serializer>(v: &Option<Vec<f32>>, s: S) -> Result<S::Ok, S::Error> {
        v.as_deref().map(Out).serialize(s)
    }

    /// Reads an optional vector inline, or from the active stash.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<f32>>, D::Error> {
        Ok(Option::<Wrapped>::deserialize(d)?.map(|w| w.0))
    }
}

/// `#[serde(with = "fedweave_core::stash::vectors")]` for `Vec<Vec<f32>>`.
pub mod vectors {
    use super::*;

    /// Serializes each vector inline, or into the active stash.
    pub fn serialize<S: Serializer>(v: &[Vec<f32>], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|x| Out(x)))
    }

    /// Reads the vectors inline, or from the active stash.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Vec<f32>>, D::Error> {
        Ok(Vec::<Wrapped>::deserialize(d)?
            .into_iter()
            .map(|w| w.0)
            .collect())
    }
}

/// `#[serde(with = "fedweave_core::stash::opt_vectors")]` for
/// `Vec<Option<Vec<f32>>>`.
pub mod opt_vectors {
    use super::*;

    /// Serializes each vector inline, or into the active stash.
    pub fn serialize<S: Serializer>(v: &[Option<Vec<f32>>], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|x| x.as_deref().map(Out)))
    }

    /// Reads the vectors inline, or from the active stash.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Option<Vec<f32>>>, D::Error> {
        Ok(Vec::<Option<Wrapped>>::deserialize(d)?
            .into_iter()
            .map(|w| w.map(|w| w.0))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct State {
        #[serde(with = "vector")]
        model: Vec<f32>,
        #[serde(with = "opt_vector")]
        extra: Option<Vec<f32>>,
        #[serde(with = "opt_vectors")]
        many: Vec<Option<Vec<f32>>>,
        scalar: f64,
    }

    fn state() -> State {
        State {
            model: vec![1.5, -0.0, f32::MIN_POSITIVE],
            extra: Some(vec![3.25]),
            many: vec![None, Some(vec![7.0, 8.0])],
            scalar: 0.1,
        }
    }

    #[test]
    fn inline_without_a_stash() {
        let text = serde_json::to_string(&state()).unwrap();
        assert!(text.contains("[1.5,-0.0,"), "{text}");
        assert_eq!(serde_json::from_str::<State>(&text).unwrap(), state());
    }

    #[test]
    fn stashed_vectors_round_trip_bit_exactly() {
        let (text, vectors) = Stash::collect(|| serde_json::to_string(&state()).unwrap());
        assert_eq!(vectors.len(), 3);
        assert_eq!(vectors[0], state().model);
        assert!(text.contains("{\"$vector\":0}"), "{text}");
        let back: State = Stash::provide(vectors, || serde_json::from_str(&text)).unwrap();
        assert_eq!(back, state());
        assert_eq!(back.model[1].to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn missing_or_extra_vectors_are_errors() {
        let (text, mut vectors) = Stash::collect(|| serde_json::to_string(&state()).unwrap());
        let mut more = vectors.clone();
        more.push(vec![1.0]);
        let extra = Stash::provide(more, || serde_json::from_str::<State>(&text));
        assert!(extra.unwrap_err().contains("not referenced"));
        vectors.pop();
        let missing = Stash::provide(vectors, || serde_json::from_str::<State>(&text));
        assert!(missing.unwrap_err().contains("missing"));
    }
}
