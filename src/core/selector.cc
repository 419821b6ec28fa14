#include "core/selector.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <sstream>
#include <type_traits>

#include "core/logging.h"
#include "dpa/error.h"

namespace dpa {
namespace {

template <typename T>
bool contains(const std::vector<T>& values, const T& value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

template <typename T>
std::string list(const std::vector<T>& values) {
  std::string text;
  for (const T& value : values) {
    if (!text.empty()) text += ", ";
    if constexpr (std::is_integral_v<T>)
      text += std::to_string(value);
    else
      text += std::string(to_string(value));
  }
  return text.empty() ? "none" : text;
}

using Rule = std::function<std::optional<std::string>(const FeatureRequest&, const Capabilities&)>;

// A rule's reason is built only when it fails: every call runs every rule of its backend.
std::optional<std::string> fail_if(bool failed, const char* reason) {
  if (failed) return std::string(reason);
  return std::nullopt;
}
std::optional<std::string> fail_if(bool failed, const std::string& reason) {
  if (failed) return reason;
  return std::nullopt;
}
template <typename MakeReason>
requires std::is_invocable_r_v<std::string, MakeReason> std::optional<std::string> fail_if(
    bool failed, MakeReason&& make_reason) {
  if (failed) return make_reason();
  return std::nullopt;
}

bool head_dim_ok(int64_t dim, const std::vector<int64_t>& allowed, int64_t max_dim) {
  if (max_dim > 0 && dim > max_dim) return false;
  return allowed.empty() || contains(allowed, dim);
}

// One rule per declared capability (DESIGN.md §6). Order only affects the order of reasons.
const std::vector<Rule>& rules() {
  static const std::vector<Rule> table = {
      [](const FeatureRequest&, const Capabilities& c) {
        return fail_if(!c.available, c.unavailable_reason);
      },
      [](const FeatureRequest& r, const Capabilities& c) {
        return fail_if(r.device != c.device, [&] {
          return "runs on " + std::string(to_string(c.device)) + " tensors, inputs are on " +
                 std::string(to_string(r.device));
        });
      },
      [](const FeatureRequest& r, const Capabilities& c) {
        return fail_if(r.device_arch < c.min_arch, [&] {
          return "needs sm_" + std::to_string(c.min_arch) + " or newer, device is sm_" +
                 std::to_string(r.device_arch);
        });
      },
      [](const FeatureRequest& r, const Capabilities& c) {
        return fail_if(!contains(c.dtypes, r.dtype), [&] {
          return "dtype " + std::string(to_string(r.dtype)) + " not supported (supports " +
                 list(c.dtypes) + ")";
        });
      },
      [](const FeatureRequest& r, const Capabilities& c) {
        return fail_if(!contains(c.formats, r.format), [&] {
          return "format " + std::string(to_string(r.format)) + " not supported";
        });
      },
      [](const FeatureRequest& r, const Capabilities& c) {
        return fail_if(!head_dim_ok(r.head_dim_qk, c.head_dims_qk, c.max_head_dim), [&] {
          return "head dim qk " + std::to_string(r.head_dim_qk) + " not supported (supports " +
                 (c.head_dims_qk.empty() ? "up to " + std::to_string(c.max_head_dim)
                                         : list(c.head_dims_qk)) +
                 ")";
        });
      },
      [](const FeatureRequest& r, const Capabilities& c) {
        return fail_if(!head_dim_ok(r.head_dim_v, c.head_dims_v, c.max_head_dim), [&] {
          return "head dim v " + std::to_string(r.head_dim_v) + " not supported (supports " +
                 (c.head_dims_v.empty() ? "up to " + std::to_string(c.max_head_dim)
                                        : list(c.head_dims_v)) +
                 ")";
        });
      },
      [](const FeatureRequest& r, const Capabilities& c) {
        return fail_if(r.head_dim_qk != r.head_dim_v && !c.different_head_dims,
                       "different qk and v head dims not supported");
      },
      [](const FeatureRequest& r, const Capabilities& c) {
        return fail_if(!contains(c.mask_types, r.mask_type), [&] {
          return "mask type " + std::string(to_string(r.mask_type)) + " not supported";
        });
      },
      [](const FeatureRequest& r, const Capabilities& c) {
        return fail_if(r.window && !c.window, "sliding window not supported");
      },
      [](const FeatureRequest& r, const Capabilities& c) {
        return fail_if(r.padded_offsets && !c.padded_offsets,
                       "thd padded offsets (cu_seqlens_*_padded) not supported");
      },
      [](const FeatureRequest& r, const Capabilities& c) {
        return fail_if(!contains(c.bias_types, r.bias_type), [&] {
          return "bias type " + std::string(to_string(r.bias_type)) + " not supported";
        });
      },
      [](const FeatureRequest& r, const Capabilities& c) {
        return fail_if(r.bias_grad && !c.bias_grad, "bias gradient not supported");
      },
      [](const FeatureRequest& r, const Capabilities& c) {
        return fail_if(r.alibi && !c.alibi, "ALiBi not supported");
      },
      [](const FeatureRequest& r, const Capabilities& c) {
        return fail_if(r.softcap && !c.softcap, "softcap not supported");
      },
      [](const FeatureRequest& r, const Capabilities& c) {
        return fail_if(!contains(c.softmax_types, r.softmax_type), [&] {
          return "softmax type " + std::string(to_string(r.softmax_type)) +
                 " (attention sink) not supported";
        });
      },
      [](const FeatureRequest& r, const Capabilities& c) {
        return fail_if(r.sink_grad && !c.sink_grad, "sink offset gradient not supported");
      },
      [](const FeatureRequest& r, const Capabilities& c) {
        return fail_if(r.dropout && !c.dropout, "dropout not supported");
      },
      [](const FeatureRequest& r, const Capabilities& c) {
        return fail_if(r.pass == Pass::kBackward && !c.backward, "backward not implemented");
      },
      [](const FeatureRequest& r, const Capabilities& c) {
        return fail_if(r.deterministic && !c.deterministic, "deterministic mode not supported");
      },
      [](const FeatureRequest& r, const Capabilities& c) {
        return fail_if(r.cp.tile && !c.cp_tiles,
                       "context-parallel tiles (global positions, sink-free partials, given "
                       "LSE) not supported");
      },
      [](const FeatureRequest& r, const Capabilities& c) -> std::optional<std::string> {
        if (!c.size_limit) return std::nullopt;
        return c.size_limit(r);
      },
  };
  return table;
}

}  // namespace

namespace {

bool rows_16_byte_aligned(const TensorView& t, const RowLayout& layout) {
  const int64_t size = int64_t(dtype_size(t.dtype));
  const auto aligned = [&](int64_t stride) { return (stride * size) % 16 == 0; };
  return reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && aligned(layout.stride_batch) &&
         aligned(layout.stride_seq) && aligned(layout.stride_head);
}

}  // namespace

FeatureRequest make_feature_request(const AttentionProblem& p) {
  FeatureRequest r;
  r.pass = p.pass;
  r.device = p.device;
  r.dtype = p.dtype;
  r.format = p.format;
  r.batch = p.batch;
  r.heads_q = p.heads_q;
  r.heads_kv = p.heads_kv;
  r.max_seqlen_q = p.max_seqlen_q;
  r.max_seqlen_kv = p.max_seqlen_kv;
  r.head_dim_qk = p.head_dim_qk;
  r.head_dim_v = p.head_dim_v;
  r.mask_type = p.mask_type;
  r.window = p.window_left >= 0 || (p.window_right >= 0 && !mask_is_causal(p.mask_type));
  r.window_span = p.window_span();
  r.bottom_right = p.bottom_right;
  r.padded_offsets = p.has_padded_offsets;
  r.queries_fill_rows = p.queries_fill_rows();
  r.keys_fill_rows = p.keys_fill_rows();
  r.bias_type = p.bias_type;
  r.bias_grad = p.wants_dbias;
  r.alibi = p.has_alibi;
  r.softcap = p.softcap > 0.0;
  r.softcap_value = p.softcap;
  r.softmax_type = p.softmax_type;
  r.sink_grad = p.wants_dsoftmax_offset;
  r.dropout = p.dropout_threshold > 0;
  r.deterministic = p.deterministic;
  r.flash_forward_kernel = p.flash_forward_kernel;
  r.flash_backward_kernel = p.flash_backward_kernel;
  r.cp.tile = p.is_cp_tile();
  for (int64_t position : p.cp.kv_position) r.cp.keys_unaligned |= position % 8 != 0;
  r.cp.dbias_local = r.cp.tile && p.wants_dbias && p.cp.dbias_local;
  r.cp.dbias_unsharded = r.cp.tile && p.wants_dbias && !p.cp.dbias_local;
  r.rows_16_byte_aligned = rows_16_byte_aligned(p.q, p.q_rows) &&
                           rows_16_byte_aligned(p.k, p.k_rows) &&
                           rows_16_byte_aligned(p.v, p.v_rows);
  if (p.pass == Pass::kForward)
    r.rows_16_byte_aligned = r.rows_16_byte_aligned && rows_16_byte_aligned(p.o, p.o_rows);
  else
    r.rows_16_byte_aligned =
        r.rows_16_byte_aligned && rows_16_byte_aligned(p.o, p.o_rows) &&
        rows_16_byte_aligned(p.d_o, p.do_rows) && rows_16_byte_aligned(p.dq, p.dq_rows) &&
        rows_16_byte_aligned(p.dk, p.dk_rows) && rows_16_byte_aligned(p.dv, p.dv_rows);
  r.device_arch = p.device_arch;
  r.device_index = p.device_index;
  return r;
}

std::vector<std::string> rejection_reasons(const FeatureRequest& request,
                                           const Capabilities& capabilities) {
  std::vector<std::string> reasons;
  for (const Rule& rule : rules())
    if (auto reason = rule(request, capabilities)) reasons.push_back(*reason);
  for (const auto& rule : capabilities.extra_rules)
    if (auto reason = rule(request)) reasons.push_back(*reason);
  return reasons;
}

Selection select_backend(const FeatureRequest& request,
                         const std::vector<const Capabilities*>& candidates,
                         std::optional<BackendKind> forced, Verdicts verdicts) {
  Selection selection;
  selection.forced = forced.has_value();
  for (const Capabilities* caps : candidates) {
    BackendVerdict verdict;
    verdict.backend = caps->kind;
    verdict.reasons = rejection_reasons(request, *caps);
    if (forced && *forced != caps->kind) {
      verdict.eligible = false;
      verdict.reasons.insert(verdict.reasons.begin(),
                             "not the forced backend " + std::string(to_string(*forced)));
    } else {
      verdict.eligible = verdict.reasons.empty();
    }
    if (verdict.eligible && !selection.chosen) selection.chosen = caps->kind;
    selection.verdicts.push_back(std::move(verdict));
    if (verdicts == Verdicts::kUntilChosen && selection.chosen) break;
  }
  if (forced) {
    bool known = false;
    for (const Capabilities* caps : candidates) known = known || caps->kind == *forced;
    if (!known) {
      BackendVerdict missing;
      missing.backend = *forced;
      missing.reasons.push_back("not compiled into this build");
      selection.verdicts.push_back(std::move(missing));
    }
  }
  return selection;
}

std::optional<BackendKind> forced_backend(BackendKind configured) {
  if (configured != BackendKind::kAuto) return configured;
  return std::nullopt;
}

void require_chosen(const Selection& selection) {
  if (selection.chosen) return;
  throw Error(ErrorCode::kNotSupported, selection.forced ? "backend" : "",
              std::string(selection.forced ? "the forced backend is not eligible"
                                           : "no backend can honour every requested feature") +
                  "\n" + selection.to_string());
}

std::string describe_request(const FeatureRequest& r) {
  std::ostringstream text;
  text << (r.pass == Pass::kForward ? "forward" : "backward") << " " << to_string(r.device) << " "
       << to_string(r.dtype) << " " << to_string(r.format) << " b=" << r.batch << " H=" << r.heads_q
       << " G=" << r.heads_kv << " sq=" << r.max_seqlen_q << " skv=" << r.max_seqlen_kv
       << " d=" << r.head_dim_qk << "/" << r.head_dim_v << " mask=" << to_string(r.mask_type)
       << (r.window ? " window" : "") << (r.padded_offsets ? " padded_offsets" : "")
       << " bias=" << to_string(r.bias_type) << (r.bias_grad ? "+grad" : "")
       << (r.alibi ? " alibi" : "") << (r.softcap ? " softcap" : "")
       << " softmax=" << to_string(r.softmax_type) << (r.sink_grad ? "+grad" : "")
       << (r.dropout ? " dropout" : "") << (r.deterministic ? " deterministic" : "")
       << (r.cp.tile ? " cp_tile" : "");
  return text.str();
}

std::string Selection::to_string() const {
  std::ostringstream text;
  if (chosen)
    text << "selected: " << dpa::to_string(*chosen) << (forced ? " (forced)" : "") << "\n";
  else
    text << "selected: none" << (forced ? " (forced backend not eligible)" : "") << "\n";
  for (const BackendVerdict& verdict : verdicts) {
    text << "  " << dpa::to_string(verdict.backend) << ": "
         << (verdict.eligible ? "eligible" : "rejected") << "\n";
    if (!verdict.plan.empty()) text << "    runs: " << verdict.plan << "\n";
    for (const std::string& reason : verdict.reasons) text << "    - " << reason << "\n";
  }
  return text.str();
}

Selection select_for_problem(const AttentionConfig& config, const AttentionProblem& problem,
                             const std::vector<const Backend*>& backends,
                             FeatureRequest* request_out, bool with_plans, Verdicts verdicts) {
  FeatureRequest request = make_feature_request(problem);
  std::vector<const Capabilities*> candidates;
  for (const Backend* backend : backends) candidates.push_back(&backend->capabilities());
  Selection selection =
      select_backend(request, candidates, forced_backend(config.backend), verdicts);
  if (with_plans)
    for (size_t n = 0; n < selection.verdicts.size() && n < candidates.size(); ++n)
      if (selection.verdicts[n].eligible && candidates[n]->describe_plan)
        selection.verdicts[n].plan = candidates[n]->describe_plan(request);
  if (request_out) *request_out = request;
  return selection;
}

const Backend& choose_backend(const AttentionConfig& config, const AttentionProblem& problem,
                              const std::vector<const Backend*>& backends) {
  FeatureRequest request;
  // The debug log prints every backend's verdict; otherwise the call stops at its backend.
  const Verdicts verdicts =
      log_level() == LogLevel::kDebug ? Verdicts::kEveryBackend : Verdicts::kUntilChosen;
  Selection selection = select_for_problem(config, problem, backends, &request, false, verdicts);
  log_selection(request, selection);
  require_chosen(selection);
  for (const Backend* backend : backends)
    if (backend->capabilities().kind == *selection.chosen) return *backend;
  throw Error(ErrorCode::kInternal, "", "selected backend is not registered");
}

}  // namespace dpa
