//! The model step the replay drives for every prefill and decode: per layer, Q/K/V for the new
//! tokens, the KV write by slot mapping, paged attention over block tables; and the page copies
//! (copy-on-write, swap) the cache manager reports. One small trait, so the replay runs with no
//! model (`--no-attention`) or with an attention backend.

use kvshare_core::{DType, PageCopy};

/// Model geometry (only what attention and the KV cache see).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Transformer layers.
    pub layers: u32,
    /// KV heads per layer.
    pub kv_heads: u32,
    /// Query heads per KV head (GQA group size).
    pub gqa: u32,
    /// Elements per head.
    pub head_dim: u32,
    /// KV cache and activation element type.
    pub dtype: DType,
}

impl Default for Geometry {
    fn default() -> Self {
        Geometry {
            layers: 2,
            kv_heads: 4,
            gqa: 2,
            head_dim: 64,
            dtype: DType::F16,
        }
    }
}

impl Geometry {
    /// Query heads.
    pub fn heads(&self) -> u32 {
        self.kv_heads * self.gqa
    }

    /// e.g. `2 layers, 8 query / 4 KV heads (GQA 2), head dim 64, f16`.
    pub fn describe(&self) -> String {
        format!(
            "{} layers, {} query / {} KV heads (GQA {}), head dim {}, {}",
            self.layers,
            self.heads(),
            self.kv_heads,
            self.gqa,
            self.head_dim,
            dtype_name(self.dtype)
        )
    }
}

/// `f32`, `f16`, `bf16`, `fp8_e4m3`, `fp8_e5m2`, `int8_per_token_head` (vLLM's
/// `kv_cache_dtype` names) or `int8`.
pub fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::Fp8E4M3 => "fp8_e4m3",
        DType::Fp8E5M2 => "fp8_e5m2",
        DType::Int8 => "int8",
        DType::Int8PerTokenHead => "int8_per_token_head",
    }
}

/// Parses the names [`dtype_name`] gives.
pub fn parse_dtype(s: &str) -> Option<DType> {
    match s {
        "f32" => Some(DType::F32),
        "f16" => Some(DType::F16),
        "bf16" => Some(DType::BF16),
        "fp8_e4m3" => Some(DType::Fp8E4M3),
        "fp8_e5m2" => Some(DType::Fp8E5M2),
        "int8" => Some(DType::Int8),
        "int8_per_token_head" => Some(DType::Int8PerTokenHead),
        _ => None,
    }
}

/// One launch over a batch of sequences, as an engine builds it from the cache manager.
#[derive(Debug, Clone, Copy)]
pub struct Forward<'a> {
    /// Decode (one new token per sequence) or prefill (varlen).
    pub decode: bool,
    /// Sequences in the batch.
    pub num_seqs: usize,
    /// New tokens, sequence after sequence.
    pub tokens: &'a [i32],
    /// Position of each new token in its sequence.
    pub positions: &'a [i32],
    /// Cumulative new-token counts, `[num_seqs + 1]`, starting at 0.
    pub query_start: &'a [i32],
    /// Tokens of each sequence including the new ones, `[num_seqs]`.
    pub context_lens: &'a [i32],
    /// Slot (`page * page_size + offset`) of each new token.
    pub slots: &'a [i64],
    /// Block tables, row-major `[num_seqs, max_pages]`, padded with -1.
    pub block_table: &'a [i32],
    /// Columns of `block_table`.
    pub max_pages: usize,
    /// Every token of each sequence (for models that check their output against a reference);
    /// empty unless [`Model::wants_history`].
    pub history: &'a [Vec<i32>],
}

impl Forward<'_> {
    /// New tokens in the batch.
    pub fn num_tokens(&self) -> usize {
        self.tokens.len()
    }
}

/// What the replay runs for each step.
pub trait Model {
    /// One line for the report header.
    fn describe(&self) -> String;
    /// Executes page copies in order (before the KV write of the step that reported them).
    fn copy_pages(&mut self, copies: &[PageCopy]) -> Result<(), String>;
    /// KV write of the new tokens and paged attention for them, every layer.
    fn forward(&mut self, f: &Forward<'_>) -> Result<(), String>;
    /// Whether [`Forward::history`] must be filled (costs a copy of every sequence per step).
    fn wants_history(&self) -> bool {
        false
    }
}

/// `--no-attention`: the cache manager alone.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoModel;

impl Model for NoModel {
    fn describe(&self) -> String {
        "none (--no-attention: cache manager only)".into()
    }
    fn copy_pages(&mut self, _copies: &[PageCopy]) -> Result<(), String> {
        Ok(())
    }
    fn forward(&mut self, _f: &Forward<'_>) -> Result<(), String> {
        Ok(())
    }
}
