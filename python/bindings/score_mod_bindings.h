// fusedattn._core's score-expression part (score_mod_bindings.cpp): called from the module's definition.
#pragma once

#include <nanobind/nanobind.h>

namespace fusedattn::python {

/// split_gathered_terms, GatheredTerms and score_expression_tree (fusedattn/score_expression.h).
void bind_score_expressions(nanobind::module_& m);

}  // namespace fusedattn::python
