// mrstack-replay: replays an allocation log against stacks and compares them.
// Everything but `main` is in the library (src/replay/replay_cli.cpp), so tests run it in-process.
#include <mrstack/replay/replay.hpp>

#include <cstdio>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  std::vector<std::string> const args(argv + 1, argv + argc);
  return mrstack::run_replay_tool(args, stdout, stderr);
}
