//! The graph methods' server steps, callable on arrays: what
//! `fedweave.servers` and the Flower strategies (`fedweave.flower`) run.
//!
//! Each function calls the one implementation the algorithm itself runs
//! (`fedweave_algos::{pfedgraph, feddwa, fedaghn}::server_step`,
//! `graph_rule::{check, mix_weights}`) on the host kernels. Arrays cross as
//! little-endian bytes (`f32` models, `f64` weights; the limited API of
//! abi3 has no buffer protocol before Python 3.11): the Python wrappers
//! check shapes and values and turn them back into numpy arrays, and these
//! functions check lengths again so that a bad call is an exception, never
//! a panic. The GIL is released while the kernels run.

use crate::err;
use fedweave_algos::fedaghn::{self, FedAghnParams, FedAghnServer, HnSign};
use fedweave_algos::graph_rule::{self, Weights};
use fedweave_algos::{Validate, feddwa, pfedgraph};
use fedweave_core::pairwise::Kernels;
use fedweave_core::{CollaborationGraph, LayerGroup};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::ops::Range;

/// `raw` (little-endian `f32`) as `rows` rows of `d` values.
fn f32_rows(raw: &[u8], rows: usize, d: usize, what: &str) -> PyResult<Vec<f32>> {
    if raw.len() != 4 * rows * d {
        return Err(err(format!(
            "{what}: {} bytes for {rows} × {d} float32 values",
            raw.len()
        )));
    }
    Ok(raw
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

/// `raw` (little-endian `f64`) as a `shape`d array's values.
fn f64_values(raw: &[u8], shape: &[usize], what: &str) -> PyResult<Vec<f64>> {
    let count: usize = shape.iter().product();
    if raw.len() != 8 * count {
        return Err(err(format!(
            "{what}: {} bytes for a {shape:?} float64 array",
            raw.len()
        )));
    }
    Ok(raw
        .chunks_exact(8)
        .map(|b| f64::from_le_bytes(b.try_into().expect("chunks of 8")))
        .collect())
}

/// Views of a flat `[m, d]` buffer's rows.
fn row_views(flat: &[f32], m: usize, d: usize) -> Vec<&[f32]> {
    (0..m).map(|k| &flat[k * d..(k + 1) * d]).collect()
}

fn f32_bytes<'a>(py: Python<'_>, rows: impl IntoIterator<Item = &'a [f32]>) -> Py<PyBytes> {
    let raw: Vec<u8> = rows
        .into_iter()
        .flat_map(|r| r.iter().flat_map(|x| x.to_le_bytes()))
        .collect();
    PyBytes::new(py, &raw).unbind()
}

fn f64_bytes<'a>(py: Python<'_>, rows: impl IntoIterator<Item = &'a [f64]>) -> Py<PyBytes> {
    let raw: Vec<u8> = rows
        .into_iter()
        .flat_map(|r| r.iter().flat_map(|x| x.to_le_bytes()))
        .collect();
    PyBytes::new(py, &raw).unbind()
}

fn graph_bytes(py: Python<'_>, g: &CollaborationGraph) -> Py<PyBytes> {
    f64_bytes(py, (0..g.n()).map(|i| g.row(i)))
}

/// `Err` unless `participants` are ascending, distinct, below `n` and as
/// many as `m`.
fn check_participants(participants: &[usize], m: usize, n: usize) -> PyResult<()> {
    if participants.len() != m {
        return Err(err(format!(
            "{} participants for {m} uploads",
            participants.len()
        )));
    }
    if participants.windows(2).any(|w| w[0] >= w[1]) {
        return Err(err("participants must be ascending and distinct"));
    }
    if let Some(&i) = participants.iter().find(|&&i| i >= n) {
        return Err(err(format!(
            "participant {i} is not one of the {n} clients"
        )));
    }
    Ok(())
}

/// Layer groups `(name, start, end)` as element ranges, checked against `d`.
fn groups_of(groups: Vec<(String, usize, usize)>, d: usize) -> PyResult<Vec<LayerGroup>> {
    if groups.is_empty() {
        return Err(err("at least one layer group is needed"));
    }
    groups
        .into_iter()
        .map(|(name, start, end)| {
            if start >= end || end > d {
                Err(err(format!(
                    "layer group {name}: elements {start}..{end} are not a non-empty range within {d}"
                )))
            } else {
                Ok(LayerGroup {
                    name,
                    range: start..end,
                })
            }
        })
        .collect()
}

/// pFedGraph's server step: returns (W over all `n` clients, `n` × `n`
/// float64 bytes, the participants' mixed models, `m` × `d` float32 bytes).
#[pyfunction]
#[pyo3(signature = (uploads, m, d, participants, n, sizes, init, alpha, threshold))]
#[allow(clippy::too_many_arguments)]
pub fn pfedgraph_step(
    py: Python<'_>,
    uploads: &[u8],
    m: usize,
    d: usize,
    participants: Vec<usize>,
    n: usize,
    sizes: Vec<usize>,
    init: &[u8],
    alpha: f64,
    threshold: f64,
) -> PyResult<(Py<PyBytes>, Py<PyBytes>)> {
    check_participants(&participants, m, n)?;
    if sizes.len() != m {
        return Err(err(format!("{} sizes for {m} uploads", sizes.len())));
    }
    if !(alpha > 0.0 && alpha.is_finite()) {
        return Err(err(format!("alpha must be > 0, got {alpha}")));
    }
    let flat = f32_rows(uploads, m, d, "uploads")?;
    let init = f32_rows(init, 1, d, "init")?;
    let step = py.detach(|| {
        let whole = 0..d;
        pfedgraph::server_step(
            Kernels::cpu(),
            n,
            &participants,
            &row_views(&flat, m, d),
            &pfedgraph::ServerInput {
                init: &init,
                ranges: std::slice::from_ref(&whole),
                threshold,
                p: &fedweave_algos::size_weights(&sizes),
                alpha,
            },
        )
    });
    Ok((
        graph_bytes(py, &step.graph),
        f32_bytes(py, step.mixed.iter().map(|(_, x)| x.as_slice())),
    ))
}

/// FedDWA's server step: returns (W over all `n` clients, the
/// participants' mixed models), as [`pfedgraph_step`].
#[pyfunction]
#[pyo3(signature = (models, guidance, m, d, participants, n, top_k))]
#[allow(clippy::too_many_arguments)]
pub fn feddwa_step(
    py: Python<'_>,
    models: &[u8],
    guidance: &[u8],
    m: usize,
    d: usize,
    participants: Vec<usize>,
    n: usize,
    top_k: usize,
) -> PyResult<(Py<PyBytes>, Py<PyBytes>)> {
    check_participants(&participants, m, n)?;
    if top_k == 0 {
        return Err(err("top_k must be at least 1"));
    }
    let models = f32_rows(models, m, d, "models")?;
    let guidance = f32_rows(guidance, m, d, "guidance")?;
    let (graph, mixed) = py.detach(|| {
        feddwa::server_step(
            Kernels::cpu(),
            n,
            &participants,
            &row_views(&guidance, m, d),
            &row_views(&models, m, d),
            top_k,
        )
    });
    Ok((
        graph_bytes(py, &graph),
        f32_bytes(py, mixed.iter().map(|(_, x)| x.as_slice())),
    ))
}

/// W (`shape` `[m, m]` or `[L, m, m]`, float64 bytes) as the rule types.
pub(crate) fn weights_of(raw: &[u8], shape: &[usize]) -> PyResult<Weights> {
    let values = f64_values(raw, shape, "W")?;
    let rows = |chunk: &[f64], m: usize| -> Vec<Vec<f64>> {
        chunk.chunks(m.max(1)).map(<[f64]>::to_vec).collect()
    };
    match *shape {
        [m, m2] if m == m2 => Ok(Weights::Whole(rows(&values, m))),
        [_, m, m2] if m == m2 => Ok(Weights::Layers(
            values.chunks((m * m).max(1)).map(|c| rows(c, m)).collect(),
        )),
        _ => Err(err(format!(
            "W has shape {shape:?}: it must be participants × participants, or layers × participants × participants"
        ))),
    }
}

/// Checks W (`shape` `[m, m]`, or `[L, m, m]` for the layer groups
/// `(name, start, end)`) as `graph-rule` does, then mixes the `m` × `d`
/// `uploads` by it; returns the mixed models (float32 bytes). A bad W is a
/// `FedweaveError` with `graph-rule`'s message.
#[pyfunction]
#[pyo3(signature = (w, shape, uploads, d, layers))]
pub fn rule_mix(
    py: Python<'_>,
    w: &[u8],
    shape: Vec<usize>,
    uploads: &[u8],
    d: usize,
    layers: Vec<(String, usize, usize)>,
) -> PyResult<Py<PyBytes>> {
    let weights = weights_of(w, &shape)?;
    let m = *shape.last().unwrap_or(&0);
    let layers: Vec<(String, Range<usize>)> = groups_of(layers, d)?
        .into_iter()
        .map(|g| (g.name, g.range))
        .collect();
    graph_rule::check(&weights, &layers, m).map_err(err)?;
    let flat = f32_rows(uploads, m, d, "uploads")?;
    let mixed = py.detach(|| {
        graph_rule::mix_weights(Kernels::cpu(), &weights, &layers, &row_views(&flat, m, d))
    });
    Ok(f32_bytes(py, mixed.iter().map(Vec::as_slice)))
}

/// FedAGHN's server: its hypernetwork state (per client and layer group,
/// the self weight p and temperature q) and its memory of the clients'
/// models, stepped by [`fedaghn::server_step`].
#[pyclass(module = "fedweave._fedweave", name = "FedAghnServer")]
pub struct AghnServer {
    state: FedAghnServer,
    params: FedAghnParams,
    groups: Vec<LayerGroup>,
    init: Vec<f32>,
}

#[pymethods]
impl AghnServer {
    /// A server for models like `init` (float32 bytes of `d` values) with
    /// the layer groups `(name, start, end)`; no clients yet.
    #[new]
    #[pyo3(signature = (init, d, groups, p_init=0.03, q_init=0.5, hn_lr=0.005, hn_sign="fedaghn"))]
    fn new(
        init: &[u8],
        d: usize,
        groups: Vec<(String, usize, usize)>,
        p_init: f64,
        q_init: f64,
        hn_lr: f64,
        hn_sign: &str,
    ) -> PyResult<Self> {
        let hn_sign = match hn_sign {
            "fedaghn" => HnSign::Fedaghn,
            "pfedhn" => HnSign::Pfedhn,
            other => {
                return Err(err(format!(
                    "hn_sign must be \"fedaghn\" or \"pfedhn\", not {other:?}"
                )));
            }
        };
        let params = FedAghnParams {
            p_init,
            q_init,
            hn_lr,
            hn_sign,
        };
        params.validate().map_err(err)?;
        let groups = groups_of(groups, d)?;
        Ok(Self {
            state: FedAghnServer::new(0, groups.len(), p_init, q_init),
            params,
            groups,
            init: f32_rows(init, 1, d, "init")?,
        })
    }

    /// Adds `more` clients in their initial state.
    fn add_clients(&mut self, more: usize) {
        self.state.add_clients(
            more,
            self.groups.len(),
            self.params.p_init,
            self.params.q_init,
        );
    }

    /// Number of clients.
    #[getter]
    fn clients(&self) -> usize {
        self.state.clients()
    }

    /// The self weights p, per client then layer group.
    #[getter]
    fn p(&self) -> Vec<Vec<f64>> {
        self.state.p.clone()
    }

    /// The temperatures q, per client then layer group.
    #[getter]
    fn q(&self) -> Vec<Vec<f64>> {
        self.state.q.clone()
    }

    /// One round: the `m` × `d` `uploads` of the ascending `participants`
    /// → (per-layer W, `L` × `n` × `n` float64 bytes, their mean, `n` ×
    /// `n`, the participants' personalised models, `m` × `d` float32).
    fn step(
        &mut self,
        py: Python<'_>,
        uploads: &[u8],
        m: usize,
        participants: Vec<usize>,
    ) -> PyResult<(Py<PyBytes>, Py<PyBytes>, Py<PyBytes>)> {
        let n = self.state.clients();
        let d = self.init.len();
        check_participants(&participants, m, n)?;
        let flat = f32_rows(uploads, m, d, "uploads")?;
        let uploads: Vec<(usize, Vec<f32>)> = participants
            .iter()
            .zip(flat.chunks(d.max(1)))
            .map(|(&i, x)| (i, x.to_vec()))
            .collect();
        let Self {
            state,
            params,
            groups,
            init,
        } = self;
        let outcome = py.detach(|| {
            fedaghn::server_step(params, Kernels::cpu(), state, init, groups, n, &uploads)
        });
        let layers: Vec<&[f64]> = outcome
            .layers
            .iter()
            .flat_map(|(_, g)| (0..g.n()).map(move |i| g.row(i)))
            .collect();
        Ok((
            f64_bytes(py, layers),
            graph_bytes(py, &outcome.graph),
            f32_bytes(py, outcome.downloads.iter().map(|(_, x)| x.as_slice())),
        ))
    }
}
