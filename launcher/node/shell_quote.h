#pragma once
// POSIX single quoting of one word: the words of the command lines launch runs on other nodes
// (launcher/cluster/remote/remote_command.h, Note [Remote command lines]) and of the commands it
// prints (shellQuote, program.h). In remote:: with the command lines it was written for.

#include <string>

namespace dtrain::launcher::remote {

// 'word' with every ' as '"'"' -- always quoted, also when it would not need it.
std::string singleQuote(const std::string& word);

}  // namespace dtrain::launcher::remote
