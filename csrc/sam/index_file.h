// On-disk layout of a static suffix-automaton index (one file, memory-mapped).
//
//   [Header: 4096 bytes][section 0][section 1]...   every section 64-byte aligned
//
// All integers little-endian. Sections are uint32 arrays, except the two that hold
// token ids (text, edge labels): those are uint16 when token_bytes == 2, chosen when
// the vocabulary has < 65535 ids (the separator is then 0xFFFF).
// header_hash covers the header bytes with header_hash itself zeroed, so a damaged
// header is caught on every open; payload_hash covers every byte after the header
// and is only checked on request (open(verify=True)), because it reads the file.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace recallspec {

// Raised for any unreadable/corrupt/mismatched index file; bound to Python.
struct IndexFormatError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

constexpr char kIndexMagic[8] = {'R', 'S', 'P', 'C', 'S', 'A', 'M', '\0'};
constexpr uint32_t kIndexVersion = 1;
constexpr size_t kHeaderBytes = 4096;
constexpr size_t kSectionAlign = 64;
constexpr size_t kFingerprintBytes = 128;
constexpr size_t kMetadataBytes = 2048;

enum Section : uint32_t {
  kText = 0,       // corpus tokens, separator after every document        [n_text]
  kStateLen,       // len(state): longest string in the state               [S]
  kStateLink,      // suffix link (kNone for the root)                      [S]
  kStateFirstPos,  // min_endpos: earliest end position in text of its strings [S]
  kStateCount,     // |endpos|: occurrences of the state's strings          [S]
  kEdgeOffset,     // CSR row starts: edges of s are [off[s], off[s+1])     [S+1]
  kEdgeToken,      // edge labels, ascending within a state                 [E]
  kEdgeTarget,     // edge targets                                          [E]
  kRootNext,       // dense root transitions by token (kNone if absent)     [vocab]
  kNumSections
};

struct SectionRef {
  uint64_t offset;  // from file start
  uint64_t bytes;
};

struct IndexHeader {
  char magic[8];
  uint32_t version;
  uint32_t header_bytes;
  uint32_t vocab_size;
  uint32_t num_sections;
  uint32_t token_bytes;  // 2 or 4: width of the text and edge-label sections
  uint32_t reserved;
  uint64_t n_tokens;  // corpus tokens (without separators)
  uint64_t n_text;    // length of the text section (tokens + one separator per document)
  uint64_t n_docs;
  uint64_t n_states;
  uint64_t n_edges;
  uint64_t file_bytes;
  uint64_t max_doc_len;
  char fingerprint[kFingerprintBytes];  // tokenizer fingerprint, NUL-padded
  char metadata[kMetadataBytes];        // build parameters as JSON, NUL-padded
  SectionRef sections[kNumSections];
  uint64_t payload_hash;
  uint64_t header_hash;
};
static_assert(sizeof(IndexHeader) <= kHeaderBytes, "header must fit its reserved block");

inline uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// Hash of the full header block with header_hash zeroed.
uint64_t header_checksum(const IndexHeader& h);

// Read-only memory mapping of a whole file. Throws IndexFormatError.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Validates magic, version, header hash, section table and file size (cheap, O(1) reads).
// With verify=true also recomputes payload_hash (reads the whole file).
const IndexHeader& validate_index(const MappedFile& f, bool verify);

// Payload hash of the bytes after the header.
uint64_t payload_checksum(const uint8_t* data, size_t size);

}  // namespace recallspec
