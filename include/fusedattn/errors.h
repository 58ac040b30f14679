// fusedattn/errors.h — the error taxonomy every layer throws and every adapter maps.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace fusedattn {

/// What went wrong, coarsely: adapters map each kind to its own exception class.
enum class ErrorKind { invalid_argument, not_supported, cudnn, cuda, setup };

/// Base of every error the library throws. `what()` is the full message, including the spec
/// string where one exists, so that any failure can be pasted back into `fusedattn run`.
class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

/// The longest value a message shows whole; a longer one is cut (see shown_value).
inline constexpr std::size_t kShownValueChars = 200;

/// `value` as an error message shows it: whole when it has at most kShownValueChars characters;
/// otherwise its first 150 characters, " ... ", its last 50 and its length, e.g.
/// `add(score,add(... ,0)))) (1048576 characters)`. A pasted 1 MB spec or score_mod expression
/// would otherwise bury the field and the requirement, and the end is kept because what a value
/// ends with is often the point (a parse error's "at character N"). UTF-8 sequences are never split.
inline std::string shown_value(const std::string& value) {
  constexpr std::size_t kHead = 150, kTail = 50;
  auto is_continuation = [](char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; };
  std::size_t characters = 0;
  for (char c : value) characters += is_continuation(c) ? 0 : 1;
  if (characters <= kShownValueChars) return value;
  std::size_t head_end = 0, tail_start = value.size();
  for (std::size_t seen = 0; head_end < value.size(); ++head_end) {  // just past the kHead-th character
    if (!is_continuation(value[head_end]) && seen++ == kHead) break;
  }
  for (std::size_t seen = 0; seen < kTail && tail_start > head_end;) {  // back to the kTail-th from the end
    if (!is_continuation(value[--tail_start])) ++seen;
  }
  return value.substr(0, head_end) + " ... " + value.substr(tail_start) + " (" + std::to_string(characters) +
         " characters)";
}

/// Bad input: names the field, the value seen and what is required. Raised before any GPU work.
/// The message shows a long value cut (shown_value); value() keeps it whole.
class InvalidArgument : public Error {
 public:
  InvalidArgument(const std::string& field, const std::string& value, const std::string& requirement)
      : Error(ErrorKind::invalid_argument, field + " = " + shown_value(value) + ": " + requirement),
        field_(field), value_(value), requirement_(requirement) {}
  const std::string& field() const noexcept { return field_; }
  const std::string& value() const noexcept { return value_; }  ///< whole, however long
  const std::string& requirement() const noexcept { return requirement_; }

 private:
  std::string field_, value_, requirement_;
};

/// The configuration is valid but cannot run here; the message lists every reason.
class NotSupported : public Error {
 public:
  explicit NotSupported(const std::string& message) : Error(ErrorKind::not_supported, message) {}
};

/// A cuDNN call failed: the call, its status, and the spec it served.
class CudnnError : public Error {
 public:
  explicit CudnnError(const std::string& message) : Error(ErrorKind::cudnn, message) {}
};

/// A CUDA runtime call failed: the call, its status, and the spec it served where there is one.
class CudaError : public Error {
 public:
  explicit CudaError(const std::string& message) : Error(ErrorKind::cuda, message) {}
};

/// The environment is wrong: a library is missing, or compile-time and run-time versions disagree.
class SetupError : public Error {
 public:
  explicit SetupError(const std::string& message) : Error(ErrorKind::setup, message) {}
};

/// The lower-case name of an error kind ("invalid_argument", ...), for logs and the CLI.
const char* to_string(ErrorKind kind) noexcept;

}  // namespace fusedattn
