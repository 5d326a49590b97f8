//! `cnn-dwa`: FedDWA's CIFAR CNN: conv 3×3→32, ReLU, pool, BN; conv
//! 3×3→64, ReLU, pool, BN; fc 512, ReLU; fc classes. The reference's
//! Dropout(0.5) before the first ReLU is left out, so results stay
//! comparable with the recorded ones; it holds no parameters.

use super::cnn_bn::build_conv_bn_fc;
use super::{BuildCx, Built, ModelInfo};
use crate::NnError;

/// The registry entry.
pub(crate) const INFO: ModelInfo = ModelInfo {
    name: "cnn-dwa",
    summary: "FedDWA's CNN: conv3×3→32, ReLU, pool, BN, conv3×3→64, ReLU, pool, BN, fc512, fc; C×32×32 (or 28×28); BN statistics stay local; no dropout",
    batched: true,
    embedding: false,
    build,
};

fn build(cx: &BuildCx) -> Result<Built, NnError> {
    build_conv_bn_fc(cx, 3, true)
}
