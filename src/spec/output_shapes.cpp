// Each output's shape in the caller's axis order (output_shapes.h).
#include "fusedattn/output_shapes.h"

#include <array>

#include "fusedattn/errors.h"

namespace fusedattn {
namespace {

using Input = AxisPick::Input;

int rank_of(AxisOrder order) { return order == AxisOrder::thd ? 3 : 4; }

// Every axis of an input, in order: a gradient's sizes.
std::vector<AxisPick> all_axes(Input input, AxisOrder order) {
  std::vector<AxisPick> out;
  for (int axis = 0; axis < rank_of(order); ++axis) out.push_back({input, axis});
  return out;
}

// The float32 per-row tensors (statistics, a row max logit): [b, h_q, s_q], or [t, h_q] by token.
std::vector<AxisPick> rows(AxisOrder order) {
  if (order == AxisOrder::thd) return {{Input::q, 0}, {Input::q, 1}};
  const std::array<int, 4> axes = axes_of(order);
  return {{Input::q, axes[0]}, {Input::q, axes[1]}, {Input::q, axes[2]}};
}

AxisPick query_heads(AxisOrder order) { return {Input::q, order == AxisOrder::thd ? 1 : axes_of(order)[1]}; }

void require_rank(const TensorView& view, AxisOrder order, const char* name) {
  if (view.rank != rank_of(order)) {
    throw InvalidArgument(std::string(name) + ".shape", std::to_string(view.rank) + " dims",
                          std::to_string(rank_of(order)) + " dims in layout " + to_string(order));
  }
}

}  // namespace

std::vector<OutputAxes> output_axes(const CallConfig& config, Pass pass) {
  const AttentionOptions& options = config.options;
  std::vector<OutputAxes> out;
  if (pass == Pass::forward) {
    std::vector<AxisPick> o = all_axes(Input::q, config.layout);
    o.back() = {Input::v, rank_of(config.kv_layout) - 1};  // v's head dim
    out.push_back({"o", o});
    if (options.stats) out.push_back({"stats", rows(config.layout)});
    if (options.max_logit == MaxLogit::row) out.push_back({"max_logit", rows(config.layout)});
    if (options.max_logit == MaxLogit::head) out.push_back({"max_logit", {query_heads(config.layout)}});
    return out;
  }
  out.push_back({"d_q", all_axes(Input::q, config.layout)});
  out.push_back({"d_k", all_axes(Input::k, config.kv_layout)});
  out.push_back({"d_v", all_axes(Input::v, config.kv_layout)});
  if (options.softmax == Softmax::sink) out.push_back({"d_sink", {query_heads(config.layout)}});
  return out;
}

std::vector<OutputShape> output_shapes(const CallConfig& config, const CallShape& shape, Pass pass) {
  require_rank(shape.q, config.layout, "q");
  require_rank(shape.k, config.kv_layout, "k");
  require_rank(shape.v, config.kv_layout, "v");
  const TensorView* inputs[] = {&shape.q, &shape.k, &shape.v};
  std::vector<OutputShape> out;
  for (const OutputAxes& output : output_axes(config, pass)) {
    OutputShape sized{output.name, {}};
    for (const AxisPick& pick : output.axes) {
      sized.sizes.push_back(inputs[static_cast<int>(pick.input)]->sizes[static_cast<std::size_t>(pick.axis)]);
    }
    out.push_back(std::move(sized));
  }
  return out;
}

}  // namespace fusedattn
