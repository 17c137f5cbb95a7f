#include "launcher/node/shell_quote.h"

namespace dtrain::launcher::remote {

std::string singleQuote(const std::string& word) {
  std::string out = "'";
  for (char c : word) {
    if (c == '\'') {
      out += "'\"'\"'";
    } else {
      out += c;
    }
  }
  out += '\'';
  return out;
}

}  // namespace dtrain::launcher::remote
