#include "sam/index_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "sam/hash64.h"

namespace recallspec {

uint64_t header_checksum(const IndexHeader& h) {
  uint8_t block[kHeaderBytes] = {};
  std::memcpy(block, &h, sizeof(IndexHeader));
  IndexHeader* copy = reinterpret_cast<IndexHeader*>(block);
  copy->header_hash = 0;
  return Hash64::of(block, kHeaderBytes, /*seed=*/0x5a5a);
}

uint64_t payload_checksum(const uint8_t* data, size_t size) {
  if (size <= kHeaderBytes) return Hash64::of(nullptr, 0, 0xa5a5);
  return Hash64::of(data + kHeaderBytes, size - kHeaderBytes, /*seed=*/0xa5a5);
}

MappedFile::MappedFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IndexFormatError(std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    throw IndexFormatError(std::string("cannot stat: ") + std::strerror(e));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ < kHeaderBytes) {
    ::close(fd);
    throw IndexFormatError("file is truncated (" + std::to_string(size_) +
                           " bytes, smaller than the " + std::to_string(kHeaderBytes) +
                           "-byte header)");
  }
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);  // the mapping keeps the file alive
  if (p == MAP_FAILED) throw IndexFormatError(std::string("mmap failed: ") + std::strerror(errno));
  data_ = static_cast<const uint8_t*>(p);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

const IndexHeader& validate_index(const MappedFile& f, bool verify) {
  const auto& h = *reinterpret_cast<const IndexHeader*>(f.data());
  if (std::memcmp(h.magic, kIndexMagic, sizeof kIndexMagic) != 0)
    throw IndexFormatError("not a recallspec suffix-automaton index (bad magic)");
  if (h.version != kIndexVersion)
    throw IndexFormatError("unsupported index format version " + std::to_string(h.version) +
                           " (this build reads version " + std::to_string(kIndexVersion) +
                           "); rebuild the index");
  if (h.header_bytes != kHeaderBytes || h.num_sections != kNumSections)
    throw IndexFormatError("header layout does not match format version");
  if (header_checksum(h) != h.header_hash) throw IndexFormatError("header checksum mismatch (file is corrupted)");
  if (h.file_bytes != f.size())
    throw IndexFormatError("file is truncated or padded: header says " + std::to_string(h.file_bytes) +
                           " bytes, file has " + std::to_string(f.size()));
  if (!(h.token_bytes == 4 || (h.token_bytes == 2 && h.vocab_size < 0xFFFF)))
    throw IndexFormatError("invalid token width in header");
  const uint64_t S = h.n_states, E = h.n_edges, tb = h.token_bytes;
  const uint64_t expect[kNumSections] = {h.n_text * tb, S * 4, S * 4, S * 4, S * 4, (S + 1) * 4,
                                         E * tb, E * 4, uint64_t(h.vocab_size) * 4};
  for (uint32_t i = 0; i < kNumSections; ++i) {
    const SectionRef& s = h.sections[i];
    if (s.bytes != expect[i] || s.offset % kSectionAlign != 0 || s.offset < kHeaderBytes ||
        s.offset + s.bytes > f.size())
      throw IndexFormatError("section " + std::to_string(i) + " is out of bounds or has the wrong size");
  }
  if (S == 0) throw IndexFormatError("index has no states");
  if (verify && payload_checksum(f.data(), f.size()) != h.payload_hash)
    throw IndexFormatError("payload checksum mismatch (file is corrupted)");
  return h;
}

}  // namespace recallspec
