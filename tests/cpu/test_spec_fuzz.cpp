// A fuzz target for the spec parser, run in the CPU tier: a million mutations of real spec strings
// (characters dropped, repeated, swapped and inserted, numbers replaced by extremes, fields cut and
// doubled, score modifiers nested and broken). Every input must either parse, validate and print
// back to an equal spec, or be refused with InvalidArgument: no other exception, no crash, no
// hang. FUSEDATTN_FUZZ_INPUTS changes the count, FUSEDATTN_FUZZ_SEED the seed (printed, so that a
// failure can be replayed).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "fusedattn/errors.h"
#include "fusedattn/score_mod.h"
#include "fusedattn/spec.h"

namespace fusedattn {
namespace {

const std::vector<std::string>& seeds() {
  static const std::vector<std::string> specs = {
      "layout=bshd dtype=bf16 b=2 s=128 h=8 d=64 causal",
      "layout=sbhd dtype=f16 b=3 s_q=200 s_kv=450 h_q=8 h_kv=2 d=64 padding=1 window=64,0 align=bottom_right",
      "layout=thd_thd_thd dtype=bf16 b=16 s=2048 h=16 d=128 causal padding=1",
      "layout=bshd_paged_bshd dtype=bf16 b=8 s_q=1 s_kv=4096 h_q=32 h_kv=8 d=128 page_size=64 pages=1024 causal "
      "align=bottom_right",
      "layout=bs3hd dtype=e4m3 b=2 s=384 h=4 d=128 causal fp8_grads=e5m2",
      "q=e4m3[2,8,128,64]/[65536,64,512,1] k=e4m3[2,8,128,64]/[65536,64,512,1] v=e4m3[2,8,128,64]/[65536,64,512,1] "
      "o=bf16[2,8,128,64]/[65536,64,512,1] window=-1,0 fp8_scaling=mxfp8",
      "layout=bshd dtype=bf16 b=2 s=256 h=4 d=64 bias=1hss bias_grad=1 softmax=sink max_logit=row dropout=0.1",
      "layout=bshd dtype=bf16 b=2 s=8192 h=16 d=128 causal score_mod=mul(tanh(div(score,$0)),$0)",
      "layout=bshd dtype=bf16 b=1 s=2048 h=1 d=64 causal score_mod=add(mul(score,t0[q]),t1[kv])",
      "layout=bshd dtype=bf16 b=2 s=300 h=4 d=64 score_mod=select(or(le(kv,q),lt(kv,$0)),score,-inf)",
      "layout=bshd_bs2hd dtype=bf16 b=2 s_q=64 s_kv=96 h_q=4 h_kv=2 d_qk=192 d_v=128 alibi=1 causal",
  };
  return specs;
}

const char* const kExtremes[] = {"0",  "-1", "1", "9223372036854775807", "9223372036854775808", "-9223372036854775808",
                                 "1e308", "nan", "inf", "-inf", "0x10", "", " ", "1.5", "999999999999"};
const char* const kPieces[] = {"=",  ",",   "(", ")", "[", "]", "$", "$9", "t9[", "score", "causal", "layout=",
                               "d=", "b=0", "h_kv=3", "s_q=", "score_mod=", "add(", "select(", "window=-2,", "\t", "\n"};

std::string mutated(const std::string& seed, std::mt19937_64& rng) {
  std::string text = seed;
  const int edits = std::uniform_int_distribution<int>(1, 4)(rng);
  for (int e = 0; e < edits; ++e) {
    const std::size_t at = text.empty() ? 0 : std::uniform_int_distribution<std::size_t>(0, text.size())(rng);
    switch (std::uniform_int_distribution<int>(0, 7)(rng)) {
      case 0:  // drop a run
        text.erase(at, std::uniform_int_distribution<std::size_t>(1, 12)(rng));
        break;
      case 1:  // a random byte, printable or not
        text.insert(at, 1, static_cast<char>(std::uniform_int_distribution<int>(0, 255)(rng)));
        break;
      case 2:  // a piece of the grammar
        text.insert(at, kPieces[std::uniform_int_distribution<std::size_t>(0, std::size(kPieces) - 1)(rng)]);
        break;
      case 3: {  // the next number becomes an extreme
        const std::size_t digit = text.find_first_of("0123456789", at);
        if (digit == std::string::npos) break;
        const std::size_t end = text.find_first_not_of("0123456789", digit);
        text.replace(digit, (end == std::string::npos ? text.size() : end) - digit,
                     kExtremes[std::uniform_int_distribution<std::size_t>(0, std::size(kExtremes) - 1)(rng)]);
        break;
      }
      case 4:  // repeat a run (doubled fields, nested expressions)
        if (at < text.size()) text.insert(at, text.substr(at, std::uniform_int_distribution<std::size_t>(1, 20)(rng)));
        break;
      case 5:  // swap two characters
        if (text.size() > 1) std::swap(text[at % text.size()], text[(at * 7 + 3) % text.size()]);
        break;
      case 6:  // cut the rest
        text.resize(at);
        break;
      default:  // splice another seed's tail
        text += " " + seeds()[std::uniform_int_distribution<std::size_t>(0, seeds().size() - 1)(rng)].substr(at % 8);
        break;
    }
  }
  return text;
}

std::uint64_t setting(const char* name, std::uint64_t fallback) {
  const char* value = std::getenv(name);
  return value && *value ? std::strtoull(value, nullptr, 10) : fallback;
}

TEST(SpecParserFuzz, AMillionMutatedSpecsParseOrAreRefusedByName) {
  const std::uint64_t inputs = setting("FUSEDATTN_FUZZ_INPUTS", 1000000);
  const std::uint64_t seed = setting("FUSEDATTN_FUZZ_SEED", std::random_device{}());
  std::printf("  %llu inputs, FUSEDATTN_FUZZ_SEED=%llu\n", static_cast<unsigned long long>(inputs),
              static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::uint64_t parsed = 0, valid = 0, refused = 0;
  for (std::uint64_t i = 0; i < inputs; ++i) {
    const std::string& base = seeds()[i % seeds().size()];
    const std::string text = mutated(base, rng);
    try {
      const AttentionSpec spec = parse_spec(text);
      ++parsed;
      validate(spec);
      ++valid;
      const std::string printed = to_string(spec);
      const AttentionSpec back = parse_spec(printed);
      ASSERT_EQ(back, spec) << "input: " << text << "\nprinted: " << printed;
    } catch (const InvalidArgument& error) {
      ++refused;
      ASSERT_FALSE(error.field().empty()) << "a refusal without a field: " << error.what() << "\ninput: " << text;
    }
    // Anything else (another exception type, a crash) fails the test with the input in the log.
  }
  std::printf("  parsed %llu, valid %llu, refused %llu\n", static_cast<unsigned long long>(parsed),
              static_cast<unsigned long long>(valid), static_cast<unsigned long long>(refused));
  EXPECT_GT(valid, 0u);    // the mutations keep some specs whole
  EXPECT_GT(refused, 0u);  // and break most
}

// `text` is refused naming `field`, with `words` in the requirement.
void expect_refused(const std::string& text, const std::string& field, const std::string& words) {
  try {
    parse_spec(text);
    ADD_FAILURE() << "parsed: " << text;
  } catch (const InvalidArgument& error) {
    EXPECT_EQ(error.field(), field) << error.what();
    EXPECT_NE(std::string(error.what()).find(words), std::string::npos) << error.what();
  }
}

// Found by the test above: a token "=2" had no key, and the refusal named an empty field.
TEST(SpecParserFuzz, AValueWithoutAKeyIsRefusedNamingTheSpec) {
  expect_refused("layout=bshd_bs2hd =2 s_q=64 s_kv=96 h_q=4 h_kv=2 d=128", "spec", "a key before the '='");
}

// Found by the fuzz test under UndefinedBehaviorSanitizer: sizes near 2^63 overflowed the layout's
// stride products (signed overflow); they are refused naming the sizes.
TEST(SpecParserFuzz, SizesWhoseStridesLeaveInt64AreRefused) {
  expect_refused("layout=bshd dtype=bf16 b=2048 s=9223372036854775807 h=8 d=64", "sizes", "fewer than 2^63 elements");
}

TEST(SpecParserFuzz, MutatedScoreModifiersParseOrAreRefusedByName) {
  const std::uint64_t seed = setting("FUSEDATTN_FUZZ_SEED", std::random_device{}());
  std::mt19937_64 rng(seed);
  const std::string expressions[] = {"mul(tanh(div(score,$0)),$0)", "add(score,mul(t0[h],sub(kv,q)))",
                                     "select(or(le(kv,q),lt(kv,$0)),score,-inf)", "sub(score,mul(0.1,pow(score,2)))"};
  for (int i = 0; i < 200000; ++i) {
    const std::string text = mutated(expressions[i % 4], rng);
    try {
      const ScoreMod mod = parse_score_mod(text);
      ASSERT_EQ(parse_score_mod(to_string(mod)), mod) << "input: " << text;
    } catch (const InvalidArgument& error) {
      ASSERT_EQ(error.field(), "score_mod") << error.what() << "\ninput: " << text;
    }
  }
}

}  // namespace
}  // namespace fusedattn
