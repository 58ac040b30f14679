// The window's own rules: its text ("LEFT,RIGHT") and what `causal` does to it (fusedattn/options.h).
#include <string>

#include "fusedattn/errors.h"
#include "fusedattn/options.h"

namespace fusedattn {

std::string to_string(const Window& window) { return std::to_string(window.left) + "," + std::to_string(window.right); }

// One rule for every entry point: the spec parser, make_call_config (both adapters' Config), the CLI
// and context parallelism (fusedattn._core.causal_window) all call this, so `causal` beside a
// window means the same everywhere and a conflict gets these words everywhere.
Window causal_window(const Window& window) {
  if (window.right != -1 && window.right != 0) {
    throw InvalidArgument("window", to_string(window),
                          "a right bound of 0 or -1 with causal (causal closes the window's right side)");
  }
  return Window{window.left, 0};
}

}  // namespace fusedattn
