// fusedattn/errors.h — the error taxonomy every layer throws and every adapter maps.
#pragma once

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

/// Bad input: names the field, the value seen and what is required. Raised before any GPU work.
class InvalidArgument : public Error {
 public:
  InvalidArgument(const std::string& field, const std::string& value, const std::string& requirement)
      : Error(ErrorKind::invalid_argument, field + " = " + value + ": " + requirement),
        field_(field), value_(value), requirement_(requirement) {}
  const std::string& field() const noexcept { return field_; }
  const std::string& value() const noexcept { return value_; }
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
