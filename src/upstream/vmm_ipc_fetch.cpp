// vmm IPC's opener, asking: connects to the exporter's socket, receives the block's runs
// and checks them against the handle before anything is mapped. Apart from the mapping
// (vmm_ipc_open.cpp) because all it trusts is the handle; the answer comes from another
// process.
#include <mrstack/error.hpp>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <string>

#include "vmm_ipc_registry.hpp"
#include "vmm_ipc_wire.hpp"

namespace mrstack::vmm_ipc {

fetched_export::~fetched_export() {
  for (int fd : fds) { ::close(fd); }
}

namespace {

// The answer comes from another process: the opener maps what it says and returns a
// pointer into it, so it must be the block the handle describes. (A damaged export id
// named another export, whose block was then mapped and handed out as this one.)
void check_answer(handle_fields const& f, reply_header const& header) {
  if (header.runs != f.runs || header.type != f.type || header.device != f.device ||
      header.block_offset != f.block_offset || header.block_bytes != f.block_bytes) {
    throw logic_error("vmm IPC: the answer of process " + std::to_string(f.pid) + " for export " +
                      std::to_string(f.export_id) + " does not match the handle (it describes " +
                      std::to_string(header.block_bytes) + " B at offset " + std::to_string(header.block_offset) +
                      " in " + std::to_string(header.runs) + " allocations; the handle " +
                      std::to_string(f.block_bytes) + " B at offset " + std::to_string(f.block_offset) + " in " +
                      std::to_string(f.runs) + "): the handle is damaged or not from this export");
  }
}

// The block must lie inside the runs received (open() returns the mapping's base plus its
// offset), and every run must have a size.
void check_runs(handle_fields const& f, fetched_export const& got) {
  std::uint64_t total = 0;
  for (std::uint64_t const n : got.bytes) {
    if (n == 0 || n > std::numeric_limits<std::uint64_t>::max() - total) {
      throw logic_error("vmm IPC: process " + std::to_string(f.pid) + " sent a physical allocation of " +
                        std::to_string(n) + " B for export " + std::to_string(f.export_id));
    }
    total += n;
  }
  if (total != f.run_bytes || got.block_offset > total || got.block_bytes > total - got.block_offset) {
    throw logic_error("vmm IPC: export " + std::to_string(f.export_id) + " of process " + std::to_string(f.pid) +
                      " describes " + std::to_string(got.block_bytes) + " B at offset " +
                      std::to_string(got.block_offset) + ", outside the " + std::to_string(total) +
                      " B of its physical allocations (the handle says " + std::to_string(f.run_bytes) + " B)");
  }
}

}  // namespace

void fetch_export(std::array<unsigned char, 64> const& h, fetched_export& out) {
  handle_fields const f = fields_of(h);
  std::string const name = socket_name(f.pid, f.nonce);
  int const s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (s < 0) { throw logic_error(std::string{"vmm IPC: socket(AF_UNIX) failed: "} + std::strerror(errno)); }
  struct closer {
    int fd;
    ~closer() { ::close(fd); }
  } const guard{s};
  set_timeouts(s, answer_timeout_s);
  sockaddr_un addr{};
  socklen_t const len = socket_address(f.pid, f.nonce, addr);
  if (connect(s, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    throw logic_error("vmm IPC: cannot reach the exporting process " + std::to_string(f.pid) + " on the Unix socket " +
                      name + " (" + std::strerror(errno) + "): it has exited, or runs in another network namespace "
                      "(container); both processes must share a host and a network namespace");
  }
  request const req{f.export_id};
  reply_header header{};
  // Descriptors belong to the batches only: one carried with the header went first in
  // out.fds, and open() imported it for the first run, every later one shifted by one.
  std::vector<int> stray;
  bool const answered = send_all(s, &req, sizeof req, nullptr, 0) && receive(s, &header, sizeof header, stray);
  for (int fd : stray) { ::close(fd); }
  if (!answered) {
    throw logic_error("vmm IPC: the exporting process " + std::to_string(f.pid) + " did not answer on " + name +
                      " (within " + std::to_string(answer_timeout_s) + " s)");
  }
  if (!stray.empty()) {
    throw logic_error("vmm IPC: process " + std::to_string(f.pid) + " sent " + std::to_string(stray.size()) +
                      " file descriptors with its answer's header for export " + std::to_string(f.export_id) +
                      " (they come only with the allocations)");
  }
  if (header.status != 0) {
    header.message[sizeof header.message - 1] = '\0';
    throw logic_error("vmm IPC: process " + std::to_string(f.pid) + " refused export " + std::to_string(f.export_id) +
                      ": " + header.message);
  }
  check_answer(f, header);
  if (header.type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR && header.type != CU_MEM_HANDLE_TYPE_FABRIC) {
    throw logic_error("vmm IPC: export " + std::to_string(f.export_id) + " of process " + std::to_string(f.pid) +
                      ": handle type " + std::to_string(header.type) +
                      " is neither fd nor fabric (the handle is damaged)");
  }
  out.type = static_cast<CUmemAllocationHandleType>(header.type);
  out.device = header.device;
  out.block_offset = header.block_offset;
  out.block_bytes = header.block_bytes;
  bool const with_fds = header.type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  while (out.bytes.size() < header.runs) {
    reply_batch batch{};
    std::size_t const fds_before = out.fds.size();
    if (!receive(s, &batch, sizeof batch, out.fds) || batch.count == 0 || batch.count > batch_runs ||
        out.bytes.size() + batch.count > header.runs) {
      throw logic_error("vmm IPC: a truncated answer from process " + std::to_string(f.pid));
    }
    if (with_fds && out.fds.size() - fds_before != batch.count) {
      throw logic_error("vmm IPC: process " + std::to_string(f.pid) + " sent " +
                        std::to_string(out.fds.size() - fds_before) + " file descriptors for " +
                        std::to_string(batch.count) + " allocations");
    }
    for (std::uint32_t k = 0; k < batch.count; ++k) {
      out.bytes.push_back(batch.bytes[k]);
      out.fabric.push_back(batch.fabric[k]);
    }
  }
  check_runs(f, out);
}

}  // namespace mrstack::vmm_ipc
