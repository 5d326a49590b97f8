//! Typed per-algorithm parameters parsed from the `[algorithm]` table and
//! checked once, and the errors of building an algorithm.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Errors building an algorithm.
#[derive(Debug, thiserror::Error)]
pub enum AlgoError {
    /// No algorithm has this name.
    #[error("unknown algorithm `{name}` (known: {known})")]
    UnknownAlgorithm {
        /// The name given.
        name: String,
        /// The names fedweave knows.
        known: String,
    },
    /// A key is unknown for this algorithm, has the wrong type, or an
    /// impossible value.
    #[error("algorithm `{algorithm}`: {message}")]
    BadParameter {
        /// The algorithm being configured.
        algorithm: String,
        /// What is wrong, naming the key (`algorithm.<key>`).
        message: String,
    },
    /// The federation lacks something the algorithm needs (e.g. a dataset
    /// relation graph).
    #[error("algorithm `{algorithm}`: {message}")]
    Unsupported {
        /// The algorithm being built.
        algorithm: String,
        /// What is missing.
        message: String,
    },
}

/// An impossible parameter value, naming its key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("algorithm.{key} {message}")]
pub struct ParamError {
    /// The key inside `[algorithm]`.
    pub key: &'static str,
    /// What is wrong with its value.
    pub message: String,
}

impl ParamError {
    /// `key` `message` (e.g. `ParamError::new("top_k", "must be at least 1")`).
    pub fn new(key: &'static str, message: impl Into<String>) -> Self {
        Self {
            key,
            message: message.into(),
        }
    }
}

/// Declares an algorithm's parameter struct with each field's default next
/// to it: the struct (cloneable, printable, parsed by serde with unknown
/// keys rejected and missing ones defaulted) and its `Default`.
macro_rules! params {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $(
                $(#[$fmeta:meta])*
                pub $field:ident: $ty:ty = $default:expr
            ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct $name {
            $($(#[$fmeta])* pub $field: $ty,)*
        }

        impl Default for $name {
            fn default() -> Self {
                Self {
                    $($field: $default,)*
                }
            }
        }
    };
}
pub(crate) use params;

/// Parameters that passed [`Validate::validate`] and had their
/// federation-dependent defaults filled in by [`Validate::resolve`]: the
/// only form an algorithm is built from (the checked half of linfa's
/// checked/unchecked pair). Made by [`Validate::check`]; reads through to
/// the parameters.
#[derive(Clone, Debug)]
pub struct Checked<P>(P);

impl<P> Checked<P> {
    /// The checked parameters.
    pub fn into_inner(self) -> P {
        self.0
    }

    /// A checked part of these parameters (a wrapper's inner method's
    /// parameters, checked with the whole).
    pub(crate) fn map<Q>(self, f: impl FnOnce(P) -> Q) -> Checked<Q> {
        Checked(f(self.0))
    }
}

impl<P> std::ops::Deref for Checked<P> {
    type Target = P;
    fn deref(&self) -> &P {
        &self.0
    }
}

/// Range checks beyond what types express, and defaults that depend on the
/// federation (so the resolved config shows the value that ran).
pub trait Validate {
    /// `Err` naming the key when a value is impossible.
    fn validate(&self) -> Result<(), ParamError> {
        Ok(())
    }

    /// Fills defaults that depend on the number of clients.
    fn resolve(&mut self, _clients: usize) {}

    /// Checks the parameters for a federation of `clients` clients: `Err`
    /// names the key of an impossible value; `Ok` holds them with the
    /// federation-dependent defaults filled in.
    fn check(mut self, clients: usize) -> Result<Checked<Self>, ParamError>
    where
        Self: Sized,
    {
        self.validate()?;
        self.resolve(clients);
        Ok(Checked(self))
    }

    /// Whether `key` of `[algorithm]` applies to the method `name`, for
    /// parameter types that several methods share (FedProx's `mu` in the
    /// FedAvg family): a key given for a method it does not apply to is
    /// rejected, and the resolved configuration leaves it out.
    fn applies(_name: &str, _key: &str) -> bool
    where
        Self: Sized,
    {
        true
    }
}

/// `Err` unless `x` is finite and ≥ 0.
pub(crate) fn non_negative(key: &'static str, x: f64) -> Result<(), ParamError> {
    if x >= 0.0 && x.is_finite() {
        Ok(())
    } else {
        Err(ParamError::new(
            key,
            format!("must be a finite number ≥ 0, got {x}"),
        ))
    }
}

/// Parses `P` from `table` (unknown keys and keys that do not apply to
/// `name` rejected) and checks it ([`Validate::check`]); returns it with its
/// resolved table.
pub(crate) fn parse<P>(
    name: &str,
    table: &toml::Table,
    clients: usize,
) -> Result<(Checked<P>, toml::Table), AlgoError>
where
    P: DeserializeOwned + Serialize + Validate,
{
    let bad = |message: String| AlgoError::BadParameter {
        algorithm: name.to_string(),
        message,
    };
    if let Some(key) = table.keys().find(|k| !P::applies(name, k)) {
        return Err(bad(format!("algorithm.{key} does not apply to `{name}`")));
    }
    let params: P =
        toml::Value::Table(table.clone())
            .try_into()
            .map_err(|e: toml::de::Error| {
                bad(format!(
                    "in [algorithm]: {}",
                    e.message()
                        .replace("unknown field `", "unknown key `algorithm.")
                ))
            })?;
    let params = params.check(clients).map_err(|e| bad(e.to_string()))?;
    let mut resolved = match toml::Value::try_from(&*params) {
        Ok(toml::Value::Table(t)) => t,
        _ => toml::Table::new(),
    };
    resolved.retain(|k, _| P::applies(name, k));
    Ok((params, resolved))
}
