#include "gpu/gpu_cases.h"

#include <gtest/gtest.h>

#include <map>

#include "gpu/device_case.h"

namespace dpa::test {
namespace {

// Sizes are chosen for the oracle's sake: cpu_exact is plain fp64 loops on one core, so a
// case keeps b*H*sq*skv near or below ~5e5 (the one sq = 1025 case and the decode cases
// excepted). skv = 300 spans five 64-key tiles, so the flash kernels take their split-KV path
// on these small grids; skv <= 191 keeps one split.
CaseSpec base_spec() {
  CaseSpec spec;
  spec.dtype = DType::kBFloat16;
  spec.batch = 2;
  spec.seqlen_q = 97;
  spec.seqlen_kv = 300;
  spec.heads_q = 4;
  spec.heads_kv = 2;
  spec.head_dim_qk = 128;
  spec.head_dim_v = 128;
  spec.seed = 2029;
  return spec;
}

using Configure = std::function<void(CaseSpec&)>;

Configure head_dims(int64_t dqk, int64_t dv, DType dtype = DType::kBFloat16) {
  return [=](CaseSpec& s) {
    s.head_dim_qk = dqk;
    s.head_dim_v = dv;
    s.dtype = dtype;
  };
}

Configure mask(MaskType type) {
  return [=](CaseSpec& s) { s.config.mask_type = type; };
}

// Applies several configurations in order.
Configure all(std::vector<Configure> steps) {
  return [steps = std::move(steps)](CaseSpec& s) {
    for (const Configure& step : steps) step(s);
  };
}

Configure sizes(int64_t batch, int64_t sq, int64_t skv, int64_t heads_q, int64_t heads_kv,
                int64_t head_dim) {
  return [=](CaseSpec& s) {
    s.batch = batch;
    s.seqlen_q = sq;
    s.seqlen_kv = skv;
    s.heads_q = heads_q;
    s.heads_kv = heads_kv;
    s.head_dim_qk = s.head_dim_v = head_dim;
  };
}

Configure window(int64_t left, int64_t right) {
  return [=](CaseSpec& s) {
    s.config.window_left = left;
    s.config.window_right = right;
  };
}

Configure no_window() { return window(-1, -1); }
Configure no_lengths() {
  return [](CaseSpec& s) {
    s.lengths_q.clear();
    s.lengths_kv.clear();
  };
}

Configure softcap(double cap) {
  return [=](CaseSpec& s) { s.config.softcap = cap; };
}

// Logits big enough that a cap bends them (DESIGN.md §9, "inputs that hide the feature"):
// with scale 1 and q, k ~ N(0, 1) the logits are N(0, d), about +-30 at the row maximum for d
// = 64..128.
Configure scale_one() {
  return [](CaseSpec& s) { s.config.scale = 1.0; };
}

Configure qk(double stddev) {
  return [=](CaseSpec& s) { s.qk_stddev = stddev; };
}

Configure softmax(SoftmaxType type) {
  return [=](CaseSpec& s) { s.config.softmax_type = type; };
}

Configure dropout(double p, uint64_t seed) {
  return [=](CaseSpec& s) {
    s.config.dropout = p;
    s.config.seed = seed;
  };
}

Configure deterministic() {
  return [](CaseSpec& s) { s.config.deterministic = true; };
}

Configure alibi(bool per_batch) {
  return [=](CaseSpec& s) {
    s.alibi = true;
    s.alibi_per_batch = per_batch;
  };
}
Configure no_alibi() {
  return [](CaseSpec& s) { s.alibi = false; };
}

Configure bias(BiasType type, std::vector<int64_t> shape) {
  return [=](CaseSpec& s) {
    s.config.bias_type = type;
    s.bias_shape = shape;
  };
}

// thd with an empty query sequence, an empty key sequence (its query rows are fully masked),
// a length-1 pair and sequences that span several tiles.
Configure thd(bool gaps) {
  return [=](CaseSpec& s) {
    s.config.format = Format::kTHD;
    s.config.mask_type = MaskType::kPadding;
    s.lengths_q = {5, 0, 1, 130, 64, 17};
    s.lengths_kv = {7, 3, 1, 100, 0, 260};
    if (gaps) {
      s.gaps_q = {2, 0, 3, 1, 4, 0};
      s.gaps_kv = {0, 5, 1, 2, 0, 3};
    }
    s.head_dim_qk = s.head_dim_v = 64;
  };
}

GpuCase make(std::string name, Configure configure, Configure without = nullptr) {
  GpuCase c;
  c.name = std::move(name);
  c.configure = std::move(configure);
  c.without = std::move(without);
  return c;
}

GpuCase unfused_only(GpuCase c) {
  c.flash = false;
  return c;
}

GpuCase with_means(GpuCase c, double qk_mean, double sink_mean) {
  c.qk_mean = qk_mean;
  c.sink_mean = sink_mean;
  return c;
}

void add_to_every_element(HostTensor& t, double shift) {
  if (shift == 0.0 || !t.defined()) return;
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, t.get(i) + shift);
}

}  // namespace

std::vector<GpuCase> gpu_cases() {
  const DType fp16 = DType::kFloat16;
  std::vector<GpuCase> cases = {
      // Every head dim with a kernel, both dtypes, and the MLA pair.
      make("hdim64_bf16", head_dims(64, 64)),
      make("hdim96_fp16", head_dims(96, 96, fp16)),
      make("hdim128_bf16", head_dims(128, 128)),
      make("hdim128_fp16", head_dims(128, 128, fp16)),
      make("hdim192_bf16", all({head_dims(192, 192), sizes(2, 97, 160, 4, 2, 192)})),
      make("hdim256_bf16", all({sizes(2, 97, 160, 4, 2, 256)})),
      make("hdim256_fp16", all({sizes(2, 64, 200, 4, 2, 256), head_dims(256, 256, fp16)})),
      // Head dim 256 with the features of the one-kernel backward's wide form (Hopper).
      with_means(make("hdim256_sink_softcap_causal",
                      all({sizes(2, 97, 160, 4, 2, 256), softmax(SoftmaxType::kLearnable),
                           softcap(5), qk(2.0), mask(MaskType::kCausal)}),
                      softcap(0)),
                 0, 4.0),
      make("hdim256_window_gqa_fp16",
           all({sizes(1, 200, 260, 8, 2, 256), head_dims(256, 256, fp16), window(40, 8)}),
           no_window()),
      make("hdim256_thd_alibi",
           all({thd(true), head_dims(256, 256), mask(MaskType::kPaddingCausal), alibi(false)}),
           no_alibi()),
      make("mla192x128_bf16", head_dims(192, 128)),
      make("mla192x128_causal_fp16", all({head_dims(192, 128, fp16), mask(MaskType::kCausal)})),
      // The wide form's uneven splits (192: consumer 0 two blocks of dk and one of dv; 192 / 128:
      // consumer 1 one of dk and all of dv) with its features.
      with_means(make("hdim192_sink_softcap_causal",
                      all({sizes(2, 97, 160, 4, 2, 192), softmax(SoftmaxType::kLearnable),
                           softcap(5), qk(2.0), mask(MaskType::kCausal)}),
                      softcap(0)),
                 0, 4.0),
      make("mla192x128_window_gqa_fp16",
           all({sizes(1, 200, 260, 8, 2, 192), head_dims(192, 128, fp16), window(40, 8)}),
           no_window()),
      make("hdim192_thd_fp16",
           all({thd(true), head_dims(192, 192, fp16), mask(MaskType::kPaddingCausal)}),
           mask(MaskType::kNoMask)),
      make("mla192x128_thd_alibi",
           all({thd(true), head_dims(192, 128), mask(MaskType::kPaddingCausal), alibi(false)}),
           no_alibi()),

      // Sizes that break tiling.
      make("sq1", sizes(2, 1, 333, 4, 2, 128)),
      make("sq1_causal_top_left", all({sizes(2, 1, 333, 4, 2, 128), mask(MaskType::kCausal)}),
           mask(MaskType::kNoMask)),
      make("sq1025_causal", all({sizes(1, 1025, 1025, 2, 1, 64), mask(MaskType::kCausal)})),
      // sq > skv bottom-right: the first 203 rows of every head see no key.
      make("fully_masked_rows_bottom_right",
           all({sizes(2, 300, 97, 4, 2, 64), mask(MaskType::kCausalBottomRight)}),
           mask(MaskType::kNoMask)),
      make("gqa_8_2", sizes(2, 97, 300, 8, 2, 64)),
      // GQA packing (flash_forward_packs_gqa: d 64, a narrow window, 4 or 8 query heads per KV
      // head; one split, flash_forward_num_splits): query counts that leave a partial block; each logit form (plain, the fixed-max softcap, the general
      // kernel with fp16 or ALiBi); two batches, and sbhd.
      make("gqa_packed_8_window_sink",
           all({sizes(2, 1100, 1100, 16, 2, 64), mask(MaskType::kCausal), window(127, 0),
                softmax(SoftmaxType::kLearnable)}),
           no_window()),
      make("gqa_packed_8_softcap_bottom_right",
           all({sizes(1, 1100, 1160, 16, 2, 64), mask(MaskType::kCausalBottomRight),
                window(127, 0), softcap(50), scale_one()}),
           no_window()),
      make("gqa_packed_4_softcap_fp16",
           all({sizes(1, 1030, 1100, 16, 4, 64), head_dims(64, 64, fp16),
                mask(MaskType::kCausalBottomRight), window(200, 0), softcap(30), scale_one()}),
           no_window()),
      make("gqa_packed_8_alibi_two_sided_window_sbhd",
           all({sizes(1, 1100, 1100, 16, 2, 64), window(100, 20), alibi(false),
                [](CaseSpec& s) { s.config.format = Format::kSBHD; }}),
           no_alibi()),
      // Windows wider than the narrow windows' 256 keys, packed (kFlashPackedWindowKeys), with up
      // to 11 key tiles per 32-position block and a partial last block. A window of 600 on 1500
      // positions moves o by 0.36 (900 moved it by only 0.18, under the 0.2 needed).
      make("gqa_8_wide_window_sink",
           all({sizes(2, 1500, 1500, 16, 2, 64), mask(MaskType::kCausal), window(600, 0),
                softmax(SoftmaxType::kLearnable)}),
           no_window()),
      make("gqa_4_wide_window_softcap_bottom_right",
           all({sizes(1, 1300, 1400, 16, 4, 64), mask(MaskType::kCausalBottomRight),
                window(700, 0), softcap(50), scale_one()}),
           no_window()),
      make("mqa_8_1", all({sizes(2, 97, 300, 8, 1, 64), mask(MaskType::kCausalBottomRight)})),
      make("sbhd_causal", all({head_dims(64, 64),
                               [](CaseSpec& s) { s.config.format = Format::kSBHD; },
                               mask(MaskType::kCausal)})),

      // Bottom-right with 12 of 16 query blocks per head seeing no key: blocks of work without
      // tiles among full ones, on sequences that fill their tensors (TMA without tails).
      make("empty_query_blocks_bottom_right",
           all({sizes(1, 2048, 512, 4, 2, 128), mask(MaskType::kCausalBottomRight)}),
           mask(MaskType::kNoMask)),
      // More than two blocks of work for some blocks of the persistent grid (a window bounded
      // on both sides, sequences that fill their tensors: 8 query blocks x 20 heads x 2 = 320
      // against 132 SMs), so that a block loads its Q buffer again (kFlashForwardWsQBuffers).
      // Causal grids scheduled from a counter (FlashForwardParams::tile_counter), d 64 (192-row
      // blocks): 272 blocks of work of two tiles against 132 SMs; then 272
      // bottom-right blocks with sq > skv, where the first 512 query rows of each head see no key,
      // so that blocks without tiles (the first two of each head) pass through the Q buffers
      // between full ones.
      make("dynamic_schedule_causal",
           all({sizes(4, 256, 256, 34, 34, 64), mask(MaskType::kCausal)}),
           mask(MaskType::kNoMask)),
      make("dynamic_schedule_empty_blocks_bottom_right",
           all({sizes(2, 640, 128, 34, 34, 64), mask(MaskType::kCausalBottomRight)}),
           mask(MaskType::kNoMask)),
      make("persistent_rounds_window_hdim64",
           all({sizes(2, 1024, 1024, 20, 20, 64), mask(MaskType::kCausal), window(200, 0)}),
           window(100, 0)),
      make("persistent_rounds_window_mla192x128",
           all({sizes(2, 1024, 1024, 20, 20, 192), head_dims(192, 128), mask(MaskType::kCausal),
                window(200, 0)}),
           window(100, 0)),

      // Every mask type (arbitrary: cuda_unfused only).
      make("causal", mask(MaskType::kCausal), mask(MaskType::kNoMask)),
      make("causal_bottom_right", mask(MaskType::kCausalBottomRight), mask(MaskType::kNoMask)),
      make("padding",
           all({mask(MaskType::kPadding),
                [](CaseSpec& s) {
                  s.lengths_q = {97, 40};
                  s.lengths_kv = {300, 1};
                }}),
           no_lengths()),
      make("padding_causal",
           all({mask(MaskType::kPaddingCausal),
                [](CaseSpec& s) {
                  s.lengths_q = {60, 97};
                  s.lengths_kv = {300, 70};
                }}),
           all({mask(MaskType::kNoMask), no_lengths()})),
      // Second sequence: sq 33 > skv 10, so its first 23 rows are fully masked.
      make("padding_causal_bottom_right",
           all({mask(MaskType::kPaddingCausalBottomRight),
                [](CaseSpec& s) {
                  s.lengths_q = {97, 33};
                  s.lengths_kv = {250, 10};
                }}),
           all({mask(MaskType::kNoMask), no_lengths()})),
      unfused_only(make("arbitrary", mask(MaskType::kArbitrary), mask(MaskType::kNoMask))),

      // Windows in both alignments.
      make("window_bottom_right", window(32, 16), no_window()),
      make("window_top_left",
           all({window(32, 16), [](CaseSpec& s) { s.config.bottom_right_diagonal = false; }}),
           no_window()),
      make("window_causal_left50", all({mask(MaskType::kCausal), window(50, 0)}), no_window()),
      make("window_causal_bottom_right_left7",
           all({mask(MaskType::kCausalBottomRight), window(7, 0)}), no_window()),

      // thd: empty and length-1 sequences, padded offsets.
      make("thd_padding", thd(false)),
      make("thd_padded_offsets_causal", all({thd(true), mask(MaskType::kPaddingCausal)})),
      make("thd_sink_causal_bottom_right",
           all({thd(true), mask(MaskType::kPaddingCausalBottomRight),
                softmax(SoftmaxType::kLearnable)}),
           softmax(SoftmaxType::kVanilla)),
      make("thd_window",
           all({thd(true), mask(MaskType::kPaddingCausalBottomRight), window(20, 0)}),
           no_window()),

      // Soft-cap 0.5 to 50 on logits it bends.
      make("softcap_0p5", all({head_dims(64, 64), softcap(0.5)}), softcap(0)),
      make("softcap_5", all({softcap(5), qk(2.0)}), softcap(0)),
      // q, k ~ 0.8 + 0.3 randn with scale 1 and d = 64: logits ~ 41 +- 3, where the cap of 50
      // halves their differences.
      with_means(make("softcap_50", all({head_dims(64, 64), softcap(50), scale_one(), qk(0.3)}),
                      softcap(0)),
                 0.8, 0),
      with_means(make("softcap_50_causal_fp16",
                      all({head_dims(64, 64, fp16), softcap(50), scale_one(), qk(0.3),
                           mask(MaskType::kCausal)}),
                      softcap(0)),
                 0.8, 0),

      // The fixed-max softcap kernel (bf16, caps up to 50.25: FlashLogitForm::kSoftcapFixedMax)
      // on partly visible tiles: thd with padded offsets and empty sequences under a window
      // with a sink at head dim 64 (two consumer warpgroups), a top-left window at 128.
      make("softcap_thd_window_sink",
           all({thd(true), mask(MaskType::kPaddingCausalBottomRight), window(20, 0),
                softmax(SoftmaxType::kLearnable), softcap(5), qk(2.0)}),
           softcap(0)),
      make("softcap_window_top_left",
           all({window(32, 16), [](CaseSpec& s) { s.config.bottom_right_diagonal = false; },
                softcap(5), qk(2.0)}),
           softcap(0)),

      // Sinks: few visible keys for off-by-one (a zero logit is invisible next to thousands of
      // keys), learnable offsets ~ 5 * randn.
      make("sink_off_by_one_fp16",
           all({head_dims(64, 64, fp16), mask(MaskType::kCausal), window(7, 0),
                softmax(SoftmaxType::kOffByOne), qk(0.5)}),
           softmax(SoftmaxType::kVanilla)),
      with_means(make("sink_learnable",
                      all({sizes(2, 97, 97, 8, 2, 128), softmax(SoftmaxType::kLearnable)}),
                      softmax(SoftmaxType::kVanilla)),
                 0, 4.0),
      make("sink_learnable_softcap_causal",
           all({sizes(2, 97, 200, 8, 2, 64), softmax(SoftmaxType::kLearnable), softcap(5),
                qk(2.0), mask(MaskType::kCausal)}),
           softmax(SoftmaxType::kVanilla)),

      // ALiBi, placed by the same diagonal as the mask.
      make("alibi_heads", alibi(false), no_alibi()),
      make("alibi_batch_top_left",
           all({alibi(true), [](CaseSpec& s) { s.config.bottom_right_diagonal = false; }}),
           no_alibi()),
      make("alibi_causal_sink",
           all({head_dims(64, 64), alibi(false), mask(MaskType::kCausal),
                softmax(SoftmaxType::kLearnable)}),
           no_alibi()),

      // Dropout: the keep mask is bit-exact (DESIGN.md §5), so the comparison stays at
      // rounding level.
      make("dropout_0p1", dropout(0.1, 1234), dropout(0, 1234)),
      make("dropout_causal_sink_softcap",
           all({head_dims(64, 64), dropout(0.2, 99), mask(MaskType::kCausal),
                softmax(SoftmaxType::kLearnable), softcap(20), scale_one()}),
           dropout(0, 99)),
      make("dropout_thd", all({thd(true), mask(MaskType::kPaddingCausal), dropout(0.15, 7)}),
           dropout(0, 7)),
      // Several key blocks of the one-kernel backward, a GQA group and tiles the window crosses
      // beside fully visible ones; head dim 256 takes the mma.sync pair with dropout.
      make("dropout_gqa_window",
           all({sizes(2, 300, 333, 8, 2, 128), window(70, 20), dropout(0.1, 5)}), dropout(0, 5)),
      // The wide one-kernel backward's keep bits (192 and MLA's 192 / 128), key blocks of 64.
      make("dropout_hdim192_sink_softcap_causal",
           all({sizes(2, 130, 200, 4, 2, 192), dropout(0.15, 21), mask(MaskType::kCausal),
                softmax(SoftmaxType::kLearnable), softcap(20)}),
           dropout(0, 21)),
      make("dropout_mla192x128_gqa_window",
           all({sizes(1, 200, 260, 8, 2, 192), head_dims(192, 128, fp16), window(70, 20),
                dropout(0.1, 6)}),
           dropout(0, 6)),
      // FlashRandomized's draw 23, named: the wide form's deterministic dropout kernel at
      // 192 / 128 in fp16, one partial query tile and key block past the first, under an
      // off-by-one softmax. Session 44 saw this draw die on an illegal instruction once
      // (bench/queued/README.md); a named case puts it in the sanitizers' filter.
      make("dropout_mla192x128_deterministic_off_by_one_fp16",
           all({sizes(1, 77, 77, 2, 1, 192), head_dims(192, 128, fp16), mask(MaskType::kPadding),
                softmax(SoftmaxType::kOffByOne), dropout(0.2, 23), deterministic(),
                [](CaseSpec& s) {
                  s.lengths_q = {77};
                  s.lengths_kv = {77};
                }}),
           dropout(0, 23)),
      make("dropout_hdim256",
           all({sizes(1, 130, 150, 4, 2, 256), head_dims(256, 256), dropout(0.1, 11)}),
           dropout(0, 11)),
      // Dropout in the warp-specialised forward at head dim 64: three consumer warpgroups (rows
      // 128-191 of a block are the third's) over several blocks of rows, and two under a narrow
      // window, with a sink and GQA.
      make("dropout_hdim64_three_warpgroups_causal",
           all({sizes(2, 400, 300, 4, 2, 64), mask(MaskType::kCausal), dropout(0.1, 17)}),
           dropout(0, 17)),
      make("dropout_hdim64_narrow_window_sink",
           all({sizes(2, 300, 300, 8, 2, 64), window(100, 0), softmax(SoftmaxType::kLearnable),
                dropout(0.15, 19)}),
           dropout(0, 19)),
      // 140 blocks of work (one split on 132 SMs) on the persistent grid, so some blocks loop
      // over two and the three-stage ring wraps (smaller grids split their keys: two or three
      // tiles per split never reuse a stage).
      make("dropout_hdim64_ring_wraps",
           all({sizes(5, 192, 130, 28, 7, 64), dropout(0.1, 23)}), dropout(0, 23)),

      // Bias tensors (cuda_unfused only), with their gradients.
      unfused_only(make("bias_post_scale",
                        all({bias(BiasType::kPostScale, {1, 4, 97, 300}), qk(0.5)}),
                        bias(BiasType::kNoBias, {}))),
      unfused_only(make("bias_pre_scale_softcap",
                        all({head_dims(64, 64), bias(BiasType::kPreScale, {2, 1, 97, 300}),
                             softcap(5), scale_one(), qk(0.3)}),
                        bias(BiasType::kNoBias, {}))),

      // fp32 storage (cuda_unfused only: fp32 GEMMs without TF32), a tight check.
      unfused_only(make("fp32_causal_sink_softcap",
                        all({head_dims(64, 64, DType::kFloat32), mask(MaskType::kCausal),
                             softmax(SoftmaxType::kLearnable), softcap(5), qk(2.0)}))),

      // qk-layer-scaling changes rounding only.
      make("layer_number_fp16",
           all({head_dims(64, 64, fp16), softcap(30), scale_one(),
                [](CaseSpec& s) { s.config.layer_number = 8; }})),

      // Decode: one query against 4k+ keys, GQA 64/8; the flash kernels split the KV axis and
      // merge by LSE. The thd variant has a batch with no keys at all.
      with_means(make("decode_gqa_64_8_sink",
                      all({sizes(2, 1, 4100, 64, 8, 128), softmax(SoftmaxType::kLearnable)}),
                      softmax(SoftmaxType::kVanilla)),
                 0, 8.0),
      // Split-KV on the warp-specialised forward where some splits lie past a block's visible
      // tiles (on 132 SMs: 5 splits of 3 tiles over 11), so they visit none.
      make("split_kv_past_the_visible_tiles", all({sizes(8, 128, 1408, 4, 4, 128)})),
      make("decode_thd_window",
           all({[](CaseSpec& s) {
                  s.config.format = Format::kTHD;
                  s.lengths_q = {1, 1, 1};
                  s.lengths_kv = {4100, 400, 0};
                  s.heads_q = 16;
                  s.heads_kv = 2;
                },
                mask(MaskType::kPaddingCausalBottomRight), window(100, 0)}),
           no_window()),
      // Decode on the KV-cache kernel (cuda_flash takes it for bshd / sbhd with at most 16
      // queries; sq1 and decode_gqa_64_8_sink above go there too): sbhd strides, a window and
      // softcap; several queries per sequence with ALiBi per batch; 128 packed rows of head dim
      // 256; a top-left causal mask where sq = skv makes it the bottom-right one.
      make("decode_sbhd_window_softcap",
           all({sizes(2, 1, 1000, 16, 2, 64),
                [](CaseSpec& s) { s.config.format = Format::kSBHD; },
                mask(MaskType::kCausalBottomRight), window(100, 0), softcap(5), qk(2.0)}),
           no_window()),
      make("decode_queries_4_alibi_off_by_one_fp16",
           all({sizes(2, 4, 700, 8, 2, 128), head_dims(128, 128, fp16), alibi(true),
                mask(MaskType::kCausalBottomRight), softmax(SoftmaxType::kOffByOne)}),
           no_alibi()),
      with_means(make("decode_queries_16_hdim256_window_sink",
                      all({sizes(1, 16, 900, 8, 1, 256), softmax(SoftmaxType::kLearnable),
                           mask(MaskType::kCausalBottomRight), window(20, 0)}),
                      no_window()),
                 0, 4.0),
      make("decode_sq_equals_skv_causal_top_left",
           all({sizes(2, 12, 12, 4, 2, 64), mask(MaskType::kCausal)}), mask(MaskType::kNoMask)),
      // cu_seqlens without a padding mask shorten the sequences as padding does: the flash
      // decode tiles take it (the KV-cache kernel's route needs full query sequences).
      make("decode_lengths_without_padding_mask",
           all({sizes(2, 4, 700, 8, 2, 64), mask(MaskType::kCausalBottomRight),
                [](CaseSpec& s) {
                  s.lengths_q = {4, 2};
                  s.lengths_kv = {700, 33};
                }}),
           no_lengths()),
      // Padding that shortens only the keys (a batch of ragged caches, HF-style padded decode)
      // stays on the KV-cache kernel: one sequence with none at all, one inside the window.
      with_means(make("decode_padded_keys_window_sink",
                      all({sizes(3, 1, 700, 16, 2, 128), softmax(SoftmaxType::kLearnable),
                           mask(MaskType::kPaddingCausalBottomRight), window(100, 0),
                           [](CaseSpec& s) {
                             s.lengths_q = {1, 1, 1};
                             s.lengths_kv = {700, 130, 0};
                           }}),
                      all({mask(MaskType::kCausalBottomRight), no_lengths()})),
                 0, 4.0),
      make("decode_keys_lengths_queries_4_fp16",
           all({sizes(2, 4, 500, 8, 2, 64), head_dims(64, 64, fp16),
                mask(MaskType::kCausalBottomRight),
                [](CaseSpec& s) {
                  s.lengths_q = {4, 4};
                  s.lengths_kv = {500, 37};
                }}),
           no_lengths()),
  };
  return cases;
}

std::vector<GpuCase> flash_cases() {
  std::vector<GpuCase> cases;
  for (GpuCase& c : gpu_cases())
    if (c.flash) cases.push_back(std::move(c));
  return cases;
}

std::vector<GpuCase> unfused_cases() {
  std::vector<GpuCase> cases;
  for (GpuCase& c : gpu_cases())
    if (c.unfused) cases.push_back(std::move(c));
  return cases;
}

CaseSpec gpu_case_spec(const GpuCase& c) {
  CaseSpec spec = base_spec();
  if (c.configure) c.configure(spec);
  return spec;
}

CaseTensors make_gpu_case_tensors(const GpuCase& c, const CaseSpec& spec) {
  CaseTensors t = make_case(spec);
  // Shifted after rounding, and rounded again: every backend still sees the same values.
  add_to_every_element(t.q, c.qk_mean);
  add_to_every_element(t.k, c.qk_mean);
  add_to_every_element(t.softmax_offset, c.sink_mean);
  return t;
}

const CaseTensors& gpu_case_tensors(const GpuCase& c) {
  return cached_tensors(c.name, [&] { return make_gpu_case_tensors(c, gpu_case_spec(c)); });
}

void expect_feature_moves_reference(const GpuCase& c) {
  if (!c.without) return;
  static std::map<std::string, double> moved_by_case;
  const CaseSpec spec = gpu_case_spec(c);
  auto found = moved_by_case.find(c.name);
  if (found == moved_by_case.end()) {
    CaseSpec without = spec;
    c.without(without);
    const CaseOutputs& with_feature = exact_reference(c.name, spec, gpu_case_tensors(c), c.unfused);
    // make_case draws q, k, v first, so both specs see the same q, k, v.
    const CaseOutputs without_feature =
        run_case(without, make_gpu_case_tensors(c, without), BackendKind::kCpuExact, false);
    found = moved_by_case.emplace(c.name, relative_error(with_feature.o, without_feature.o)).first;
  }
  const double needed = 10.0 * output_tolerance(spec.dtype);
  ::testing::Test::RecordProperty("feature_moves_o", std::to_string(found->second));
  EXPECT_GT(found->second, needed)
      << c.name << ": the feature moves the cpu_exact o by only " << found->second
      << " (needs > 10x the o tolerance); the test could not fail";
}

void check_case_on_backend(const GpuCase& c, BackendKind backend, bool backward) {
  const CaseSpec spec = gpu_case_spec(c);
  expect_feature_moves_reference(c);
  const CaseTensors& tensors = gpu_case_tensors(c);
  // Gradients are computed with the first request whenever any suite will need them.
  const CaseOutputs& reference = exact_reference(c.name, spec, tensors, c.unfused || backward);
  if (reference_only_mode()) GTEST_SKIP() << "DPA_GPU_TESTS_REFERENCE_ONLY: reference computed";
  const CaseOutputs got = run_device_case(spec, tensors, backend, backward);
  EXPECT_EQ(got.forward_backend, backend);
  if (backward) {
    EXPECT_EQ(got.backward_backend, backend);
  }
  expect_matches_reference(got, reference, spec.dtype, backward,
                           c.name + " on " + std::string(to_string(backend)));
}

}  // namespace dpa::test
