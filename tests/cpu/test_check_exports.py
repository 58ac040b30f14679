#!/usr/bin/env python3
"""tests/cpu/test_check_exports.py — the export check (check_exports.py) can fail: each kind of
symbol that must stay inside libfusedattn is refused with its reason, the public API is accepted,
and a public function that is not exported is reported. Against the real public headers.

    python3 tests/cpu/test_check_exports.py [include/fusedattn]
"""
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_exports  # noqa: E402

HEADERS = Path(__file__).resolve().parents[2] / "include" / "fusedattn"
STRING = "std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > const&"


class ExportCheck(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.api = check_exports.public_api(HEADERS)

    def refused(self, symbol, reason):
        why = check_exports.check_symbol(symbol, self.api)
        self.assertIsNotNone(why, f"{symbol} was accepted")
        self.assertIn(reason, why, symbol)

    def accepted(self, symbol):
        self.assertIsNone(check_exports.check_symbol(symbol, self.api), symbol)

    def test_refuses_internal_symbols(self):
        self.refused("fusedattn::detail::handle_for(int, CUstream_st*)", "detail::")
        self.refused("fusedattn::detail::ReplayCache::~ReplayCache()", "detail::")
        self.refused("__half fusedattn::(anonymous namespace)::from_float<__half>(float)", "anonymous namespace")
        # a support rule that src/ defines in namespace fusedattn without declaring it in a header
        self.refused("fusedattn::paged_rule(fusedattn::AttentionSpec const&, fusedattn::Pass, fusedattn::Versions "
                     "const&, std::vector<fusedattn::Reason, std::allocator<fusedattn::Reason> >&)",
                     "not declared in a public header")
        self.refused("fusedattn::Plan::execute(void* const*, CUstream_st*, void*) const", "not a public member")
        self.refused("fusedattn::Plan::require_lengths(int const*, int const*) const", "not a public member")
        self.refused("std::vector<fusedattn::Reason, std::allocator<fusedattn::Reason> >::~vector()",
                     "not in namespace fusedattn")
        self.refused("typeinfo for std::_Sp_counted_ptr_inplace<fusedattn::Plan, std::allocator<void>, "
                     "(__gnu_cxx::_Lock_policy)2>", "no public header declares")
        # a public name overloaded for a type of src/
        self.refused("fusedattn::to_string[abi:cxx11](fusedattn::PlanStore const&)", "fusedattn::PlanStore")

    def test_accepts_the_public_api(self):
        self.accepted(f"fusedattn::parse_spec({STRING})")
        self.accepted("fusedattn::to_string[abi:cxx11](fusedattn::AttentionSpec const&)")
        self.accepted("double fusedattn::relative_error<float, double>(float const*, double const*, long)")
        self.accepted("fusedattn::PlanKeyHash::operator()(fusedattn::PlanKey const&) const")
        self.accepted("fusedattn::operator==(fusedattn::AttentionSpec const&, fusedattn::AttentionSpec const&)")
        self.accepted("fusedattn::Plan::~Plan()")
        self.accepted("fusedattn::Plan::run(fusedattn::ForwardTensors const&, float, CUstream_st*, "
                      "fusedattn::Workspace const&) const")
        self.accepted("fusedattn::Plan::Plan(fusedattn::AttentionSpec, fusedattn::Pass, int, "
                      "std::shared_ptr<fusedattn::graph::CompiledGraph const>)")
        self.accepted("typeinfo for fusedattn::CudaError")
        self.accepted("vtable for fusedattn::InvalidArgument")
        self.accepted("fusedattn::Reason::~Reason()")

    def test_reports_a_public_function_that_is_not_exported(self):
        symbols = [("T", f"fusedattn::parse_spec({STRING})")]
        missing = "\n".join(check_exports.problems(symbols, self.api))
        self.assertIn("but not exported: fusedattn::get_plan", missing)
        self.assertIn("but not exported: fusedattn::Plan::run", missing)
        self.assertNotIn("not exported: fusedattn::parse_spec\n", missing)
        self.assertIn("add `fusedattn::get_plan[!_a-zA-Z0-9]*;` to cmake/fusedattn.map", missing)


if __name__ == "__main__":
    if len(sys.argv) > 1 and not sys.argv[1].startswith("-"):
        HEADERS = Path(sys.argv.pop(1))
    unittest.main()
