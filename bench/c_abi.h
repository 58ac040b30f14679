// bench/c_abi.h — the benchmark's C ABI convention: every exported function returns 0 on success;
// otherwise 2 (invalid argument), 3 (not supported), 5 (CUDA, cuDNN or setup error) or 1
// (anything else), with "<kind>: <message>" in `err`.
#pragma once

#include <cstdio>
#include <exception>
#include <string>

#include "fusedattn/errors.h"

namespace fusedattn::bench {

namespace fa = fusedattn;

inline void write_error(char* err, int errlen, const std::string& message) {
  if (err == nullptr || errlen <= 0) return;
  std::snprintf(err, static_cast<std::size_t>(errlen), "%s", message.c_str());
}

// Runs `body`, turning every exception into a return code and a message: nothing may unwind
// through the C ABI into Python.
template <class Body>
int guarded(char* err, int errlen, Body&& body) {
  try {
    body();
    write_error(err, errlen, "");
    return 0;
  } catch (const fa::Error& error) {
    write_error(err, errlen, std::string(fa::to_string(error.kind())) + ": " + error.what());
    switch (error.kind()) {
      case fa::ErrorKind::invalid_argument: return 2;
      case fa::ErrorKind::not_supported: return 3;
      default: return 5;
    }
  } catch (const std::exception& error) {
    write_error(err, errlen, std::string("error: ") + error.what());
    return 1;
  }
}

}  // namespace fusedattn::bench
