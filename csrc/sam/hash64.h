// Streaming 64-bit checksum for index payloads.
//
// Four independent multiply-rotate lanes over 32-byte blocks (the same round
// structure as the public xxHash64 design), so it runs at memory speed. It is a
// corruption check, not a cryptographic hash. Streaming: feed bytes in any
// chunking; the digest depends only on the concatenated bytes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace recallspec {

class Hash64 {
 public:
  explicit Hash64(uint64_t seed = 0) {
    lane_[0] = seed + kP1 + kP2;
    lane_[1] = seed + kP2;
    lane_[2] = seed;
    lane_[3] = seed - kP1;
  }

  void update(const void* data, size_t n) {
    auto* p = static_cast<const uint8_t*>(data);
    total_ += n;
    if (buffered_) {  // top up a partial block first
      size_t take = n < 32 - buffered_ ? n : 32 - buffered_;
      std::memcpy(buf_ + buffered_, p, take);
      buffered_ += take;
      p += take;
      n -= take;
      if (buffered_ < 32) return;
      block(buf_);
      buffered_ = 0;
    }
    while (n >= 32) {
      block(p);
      p += 32;
      n -= 32;
    }
    if (n) {
      std::memcpy(buf_, p, n);
      buffered_ = n;
    }
  }

  uint64_t digest() const {
    uint64_t h = rotl(lane_[0], 1) + rotl(lane_[1], 7) + rotl(lane_[2], 12) + rotl(lane_[3], 18);
    for (uint64_t l : lane_) h = (h ^ round(0, l)) * kP1 + kP4;
    h += total_;
    size_t i = 0;
    for (; i + 8 <= buffered_; i += 8) h = rotl(h ^ round(0, load(buf_ + i)), 27) * kP1 + kP4;
    for (; i < buffered_; ++i) h = rotl(h ^ (buf_[i] * kP5), 11) * kP1;
    h ^= h >> 33;
    h *= kP2;
    h ^= h >> 29;
    h *= kP3;
    h ^= h >> 32;
    return h;
  }

  static uint64_t of(const void* data, size_t n, uint64_t seed = 0) {
    Hash64 h(seed);
    h.update(data, n);
    return h.digest();
  }

 private:
  static constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL;
  static constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
  static constexpr uint64_t kP3 = 0x165667B19E3779F9ULL;
  static constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ULL;
  static constexpr uint64_t kP5 = 0x27D4EB2F165667C5ULL;

  static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
  static uint64_t load(const uint8_t* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
  }
  static uint64_t round(uint64_t acc, uint64_t in) { return rotl(acc + in * kP2, 31) * kP1; }
  void block(const uint8_t* p) {
    for (int i = 0; i < 4; ++i) lane_[i] = round(lane_[i], load(p + 8 * i));
  }

  uint64_t lane_[4];
  uint8_t buf_[32];
  size_t buffered_ = 0;
  uint64_t total_ = 0;
};

}  // namespace recallspec
