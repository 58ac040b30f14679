// Tier 1: error messages stay readable whatever was pasted in. InvalidArgument shows a long value
// cut (shown_value: its start, its end and its length) and keeps the field, the requirement and the
// whole value in value().
#include <gtest/gtest.h>

#include <string>

#include "fusedattn/errors.h"
#include "fusedattn/score_mod.h"
#include "fusedattn/spec.h"

namespace fusedattn {
namespace {

TEST(ShownValue, ShortValuesWhole) {
  EXPECT_EQ(shown_value(""), "");
  EXPECT_EQ(shown_value("bshd"), "bshd");
  const std::string limit(kShownValueChars, 'x');
  EXPECT_EQ(shown_value(limit), limit);
}

TEST(ShownValue, LongValuesCutWithTheirLength) {
  std::string value(kShownValueChars + 1, 'x');
  value.front() = 'A';
  value.back() = 'Z';
  const std::string shown = shown_value(value);
  EXPECT_EQ(shown, std::string("A") + std::string(149, 'x') + " ... " + std::string(49, 'x') + "Z (201 characters)");

  const std::string megabyte(1 << 20, 'y');
  const std::string cut = shown_value(megabyte);
  EXPECT_EQ(cut, std::string(150, 'y') + " ... " + std::string(50, 'y') + " (1048576 characters)");
}

TEST(ShownValue, CountsAndCutsWholeUtf8Characters) {
  std::string value;
  for (int i = 0; i < 300; ++i) value += "\xC3\xA9";  // é, two bytes
  std::string expected;
  for (int i = 0; i < 150; ++i) expected += "\xC3\xA9";
  expected += " ... ";
  for (int i = 0; i < 50; ++i) expected += "\xC3\xA9";
  EXPECT_EQ(shown_value(value), expected + " (300 characters)");
  std::string two_hundred;
  for (int i = 0; i < 200; ++i) two_hundred += "\xC3\xA9";  // 400 bytes, 200 characters: whole
  EXPECT_EQ(shown_value(two_hundred), two_hundred);
}

TEST(InvalidArgumentMessage, KeepsFieldAndRequirementAndTheWholeValue) {
  const std::string value(5000, 'q');
  const InvalidArgument error("layout", value, "one of bshd, sbhd");
  EXPECT_EQ(std::string(error.what()), "layout = " + shown_value(value) + ": one of bshd, sbhd");
  EXPECT_EQ(error.field(), "layout");
  EXPECT_EQ(error.value(), value);
  EXPECT_EQ(error.requirement(), "one of bshd, sbhd");
  EXPECT_EQ(std::string(InvalidArgument("d", "60", "a multiple of 8").what()), "d = 60: a multiple of 8");
}

// A 1 MB spec string: the message names the field and the requirement in a few hundred characters.
TEST(InvalidArgumentMessage, AMegabyteSpecValueIsShownCut) {
  const std::string layout(1 << 20, 'z');
  try {
    parse_spec("layout=" + layout + " b=2 s=128 h=8 d=64");
    FAIL() << "a made-up layout parsed";
  } catch (const InvalidArgument& error) {
    const std::string message = error.what();
    EXPECT_EQ(error.field(), "layout");
    EXPECT_EQ(error.value(), layout);
    EXPECT_EQ(message.rfind("layout = zzz", 0), 0u) << message.substr(0, 300);
    EXPECT_NE(message.find(" ... "), std::string::npos);
    EXPECT_NE(message.find("(1048576 characters): " + error.requirement()), std::string::npos);
    EXPECT_LT(message.size(), 300 + error.requirement().size());
  }
}

// A long score_mod expression that fails to parse near its end: the cut keeps where it failed.
TEST(InvalidArgumentMessage, ALongScoreModKeepsThePositionOfItsError) {
  // A constant written with 100000 digits, then one closing parenthesis too many.
  const std::string text = "mul(score,1." + std::string(100000, '0') + "))";
  try {
    parse_score_mod(text);
    FAIL() << "an unbalanced expression parsed";
  } catch (const InvalidArgument& error) {
    const std::string message = error.what();
    EXPECT_EQ(error.field(), "score_mod");
    EXPECT_LT(message.size(), 300 + error.requirement().size()) << message.substr(0, 400);
    EXPECT_NE(message.find("\" at character " + std::to_string(text.size() - 1) + " ("), std::string::npos) << message;
    EXPECT_NE(message.find(" characters): "), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace fusedattn
