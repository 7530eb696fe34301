#include <mrstack/detail/format.hpp>
#include <mrstack/detail/stack_trace.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include <cxxabi.h>
#include <dlfcn.h>
#include <elf.h>
#include <execinfo.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace mrstack::detail {

[[gnu::noinline]] std::size_t capture_stack(void** frames, std::size_t max_frames, std::size_t skip) noexcept {
  constexpr std::size_t local_max = 128;
  void* local[local_max];
  // Unwinding costs per frame: ask only for what is kept, plus room for our own frame
  // and any wrapper around backtrace().
  std::size_t const want = std::min(local_max, max_frames + skip + 4);
  int const got = ::backtrace(local, static_cast<int>(want));
  if (got <= 0) { return 0; }
  auto const count = static_cast<std::size_t>(got);
  // Start at our caller: find the frame that returns into it. Counting frames instead
  // would be thrown off by whatever wraps backtrace() (sanitizers intercept it).
  void* const caller = __builtin_return_address(0);
  std::size_t first = 1;
  for (std::size_t i = 0; i < count; ++i) {
    if (local[i] == caller) {
      first = i;
      break;
    }
  }
  first += skip;
  if (first >= count) { return 0; }
  std::size_t const n = std::min(max_frames, count - first);
  std::copy_n(local + first, n, frames);
  return n;
}

namespace {

/// The function symbols of one ELF file, sorted by address (relative to the load bias).
class symbol_table {
 public:
  explicit symbol_table(char const* path) { load(path); }

  /// The symbol containing `offset`, with the offset into it; nullptr when none does.
  [[nodiscard]] char const* find(std::uint64_t offset, std::uint64_t& into) const {
    auto it = std::upper_bound(symbols_.begin(), symbols_.end(), offset,
                               [](std::uint64_t off, entry const& e) { return off < e.address; });
    if (it == symbols_.begin()) { return nullptr; }
    --it;
    if (offset - it->address >= std::max<std::uint64_t>(it->size, 1)) { return nullptr; }
    into = offset - it->address;
    return names_.data() + it->name;
  }

 private:
  struct entry {
    std::uint64_t address;
    std::uint64_t size;
    std::size_t name;  // offset into names_
  };

  void load(char const* path) {
    int const fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) { return; }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(Elf64_Ehdr))) {
      ::close(fd);
      return;
    }
    auto const size = static_cast<std::size_t>(st.st_size);
    void* const map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) { return; }
    read(static_cast<unsigned char const*>(map), size);
    ::munmap(map, size);
    std::sort(symbols_.begin(), symbols_.end(), [](entry const& a, entry const& b) { return a.address < b.address; });
  }

  // Every offset is checked against the file size: a truncated or odd file yields fewer
  // names, never a crash.
  void read(unsigned char const* file, std::size_t size) {
    Elf64_Ehdr ehdr;
    std::memcpy(&ehdr, file, sizeof ehdr);
    if (std::memcmp(ehdr.e_ident, ELFMAG, SELFMAG) != 0 || ehdr.e_ident[EI_CLASS] != ELFCLASS64 ||
        ehdr.e_shentsize != sizeof(Elf64_Shdr) || ehdr.e_shoff == 0 ||
        ehdr.e_shoff > size || ehdr.e_shnum > (size - ehdr.e_shoff) / sizeof(Elf64_Shdr)) {
      return;
    }
    auto section = [&](std::size_t i) {
      Elf64_Shdr sh;
      std::memcpy(&sh, file + ehdr.e_shoff + i * sizeof(Elf64_Shdr), sizeof sh);
      return sh;
    };
    // Prefer the full symbol table (static functions too); fall back to the dynamic one.
    for (Elf64_Word wanted : {Elf64_Word{SHT_SYMTAB}, Elf64_Word{SHT_DYNSYM}}) {
      for (std::size_t i = 0; i < ehdr.e_shnum; ++i) {
        Elf64_Shdr const sh = section(i);
        if (sh.sh_type != wanted || sh.sh_link >= ehdr.e_shnum) { continue; }
        Elf64_Shdr const strings = section(sh.sh_link);
        if (sh.sh_offset > size || sh.sh_size > size - sh.sh_offset || strings.sh_offset > size ||
            strings.sh_size > size - strings.sh_offset) {
          continue;
        }
        std::size_t const count = sh.sh_size / sizeof(Elf64_Sym);
        for (std::size_t k = 0; k < count; ++k) {
          Elf64_Sym sym;
          std::memcpy(&sym, file + sh.sh_offset + k * sizeof(Elf64_Sym), sizeof sym);
          if (ELF64_ST_TYPE(sym.st_info) != STT_FUNC || sym.st_value == 0 || sym.st_name >= strings.sh_size) {
            continue;
          }
          auto const* name = reinterpret_cast<char const*>(file + strings.sh_offset + sym.st_name);
          std::size_t const len = strnlen(name, strings.sh_size - sym.st_name);
          symbols_.push_back(entry{sym.st_value, sym.st_size, names_.size()});
          names_.insert(names_.end(), name, name + len);
          names_.push_back('\0');
        }
      }
      if (!symbols_.empty()) { return; }
    }
  }

  std::vector<entry> symbols_;
  std::vector<char> names_;
};

std::mutex tables_mutex;
std::map<std::string, std::unique_ptr<symbol_table>>& tables() {
  static auto* t = new std::map<std::string, std::unique_ptr<symbol_table>>();  // lives to exit: reports may run late
  return *t;
}

std::string demangle(char const* name) {
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> out{abi::__cxa_demangle(name, nullptr, nullptr, &status), &std::free};
  return status == 0 && out ? std::string{out.get()} : std::string{name};
}

}  // namespace

std::string describe_frame(void const* return_address) {
  auto const address = reinterpret_cast<std::uintptr_t>(return_address);
  Dl_info info{};
  link_map* module = nullptr;
  if (::dladdr1(return_address, &info, reinterpret_cast<void**>(&module), RTLD_DL_LINKMAP) == 0 ||
      module == nullptr) {
    return format_hex(address);
  }
  // The main program's link map has an empty name; its file is /proc/self/exe.
  std::string const path = (module->l_name != nullptr && module->l_name[0] != '\0') ? module->l_name : "/proc/self/exe";
  std::string module_name = info.dli_fname != nullptr && info.dli_fname[0] != '\0' ? info.dli_fname : path;
  if (auto slash = module_name.rfind('/'); slash != std::string::npos) { module_name.erase(0, slash + 1); }
  // A return address points after the call; look up the byte before it so a call that
  // ends a function is attributed to that function.
  // Offsets are relative to the load bias: the addresses the ELF file itself (and so
  // addr2line) uses, for position-independent and fixed-address modules alike.
  std::uint64_t const offset = address - module->l_addr;
  std::string function;
  std::uint64_t into = 0;
  {
    std::lock_guard lock{tables_mutex};
    auto& table = tables()[path];
    if (!table) { table = std::make_unique<symbol_table>(path.c_str()); }
    if (char const* name = table->find(offset - 1, into)) {
      function = demangle(name);
      ++into;
    }
  }
  if (function.empty() && info.dli_sname != nullptr) {
    function = demangle(info.dli_sname);
    into = address - reinterpret_cast<std::uintptr_t>(info.dli_saddr);
  }
  std::string out = function.empty() ? std::string{"??"} : function + "+" + format_hex(into);
  out += " (" + module_name + "+" + format_hex(offset) + ")";
  return out;
}

}  // namespace mrstack::detail
