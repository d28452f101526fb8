// IDX reading through zlib (which reads plain files too); see dataset.h.
#include "dataset.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <vector>

namespace fashion_mnist {
namespace {

// Mean and standard deviation of the Fashion-MNIST training pixels.
constexpr double kMean = 0.2860;
constexpr double kStd = 0.3530;

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};

std::string find_file(const std::string& dir, const std::string& name) {
  for (const std::string& candidate : {dir + "/" + name + ".gz", dir + "/" + name})
    if (std::filesystem::exists(candidate)) return candidate;
  throw std::runtime_error("Fashion-MNIST file " + name + "(.gz) not found in " + dir +
                           "; install Debian's dataset-fashion-mnist (make run does) or pass --data DIR");
}

constexpr std::uint32_t kImagesMagic = 0x00000803;  // unsigned bytes, 3 dimensions
constexpr std::uint32_t kLabelsMagic = 0x00000801;  // unsigned bytes, 1 dimension
constexpr std::uint32_t kSide = 28;                 // the model takes 28x28 images
constexpr int kClasses = 10;

using std::to_string;

std::string hex32(std::uint32_t v) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", v);
  return text;
}

std::runtime_error bad_file(const std::string& path, const std::string& problem) {
  return std::runtime_error("Fashion-MNIST file " + path + " " + problem +
                            "; reinstall Debian's dataset-fashion-mnist or pass --data DIR with intact files");
}

// Reads an IDX file: a big-endian header (magic, then one u32 per
// dimension) and the bytes. The header is checked before anything is
// allocated: the magic, a count of at least one, 28x28 images; a plain
// file's size must match the header exactly. A gzip file's uncompressed size
// is known only by reading it, so its data is read in chunks and the vector
// grows with what really arrives: a header that promises more than the file
// holds is an error, never a huge allocation.
std::vector<std::uint8_t> read_idx(const std::string& path, std::uint32_t magic, std::vector<std::uint32_t>& dims) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) throw bad_file(path, "is not a regular file");
  const std::uintmax_t file_bytes = std::filesystem::file_size(path, ec);
  std::unique_ptr<gzFile_s, GzCloser> f(gzopen(path.c_str(), "rb"));
  if (!f) throw bad_file(path, "cannot be opened");
  const auto read_u32 = [&] {
    unsigned char b[4];
    if (gzread(f.get(), b, 4) != 4) throw bad_file(path, "is too short for an IDX header (empty or cut off)");
    return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) | b[3];
  };
  const std::uint32_t found = read_u32();
  if (found != magic)
    throw bad_file(path, std::string("is not an IDX file of ") + (magic == kImagesMagic ? "images" : "labels") +
                             " (it starts with " + hex32(found) + ", not " + hex32(magic) + ")");
  std::uint64_t total = 1;
  for (auto& d : dims) {
    d = read_u32();
    total *= d;
  }
  if (dims[0] == 0) throw bad_file(path, "holds no samples (its header gives a count of 0)");
  if (dims.size() == 3 && (dims[1] != kSide || dims[2] != kSide))
    throw bad_file(path, "holds " + to_string(dims[1]) + "x" + to_string(dims[2]) + " images, not the " +
                             to_string(kSide) + "x" + to_string(kSide) + " of Fashion-MNIST");
  const std::uint64_t header_bytes = 4 * (1 + dims.size());
  if (gzdirect(f.get()) && file_bytes != header_bytes + total)
    throw bad_file(path, "has " + to_string(file_bytes) + " bytes where its header (" + to_string(dims[0]) +
                             " samples) calls for " + to_string(header_bytes + total) + ": it is " +
                             (file_bytes < header_bytes + total ? "truncated" : "followed by extra bytes"));
  std::vector<std::uint8_t> data;
  constexpr std::uint64_t kChunk = 1 << 20;
  while (data.size() < total) {
    const std::size_t got = data.size();
    data.resize(got + static_cast<std::size_t>(std::min(total - got, kChunk)));
    const int n = gzread(f.get(), data.data() + got, static_cast<unsigned>(data.size() - got));
    if (n < 0) {
      int code = 0;
      throw bad_file(path, std::string("cannot be decompressed (") + gzerror(f.get(), &code) + ")");
    }
    if (n == 0)
      throw bad_file(path, "is truncated: it holds " + to_string(got) + " bytes of data where its header calls for " +
                               to_string(total));
    data.resize(got + static_cast<std::size_t>(n));
  }
  unsigned char extra = 0;
  if (gzread(f.get(), &extra, 1) > 0)
    throw bad_file(path, "has data after the " + to_string(total) + " bytes its header calls for");
  return data;
}

}  // namespace

Dataset::Dataset(const std::string& dir, bool train, std::size_t limit) {
  const std::string prefix = train ? "train" : "t10k";
  std::vector<std::uint32_t> image_dims(3), label_dims(1);
  const std::string images_path = find_file(dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_file(dir, prefix + "-labels-idx1-ubyte");
  auto pixels = read_idx(images_path, kImagesMagic, image_dims);
  auto labels = read_idx(labels_path, kLabelsMagic, label_dims);
  if (image_dims[0] != label_dims[0])
    throw bad_file(labels_path, "holds " + to_string(label_dims[0]) + " labels for the " + to_string(image_dims[0]) +
                                    " images of " + images_path);
  for (std::size_t i = 0; i < labels.size(); ++i)
    if (labels[i] >= kClasses)
      throw bad_file(labels_path, "gives sample " + to_string(i) + " the label " + to_string(labels[i]) +
                                      ", not a class from 0 to " + to_string(kClasses - 1));
  std::int64_t n = image_dims[0];
  if (limit > 0) n = std::min<std::int64_t>(n, static_cast<std::int64_t>(limit));
  images_ = torch::from_blob(pixels.data(), {static_cast<std::int64_t>(image_dims[0]), 1, image_dims[1], image_dims[2]},
                             torch::kUInt8)
                .slice(0, 0, n)
                .to(torch::kFloat32)
                .div_(255.0)
                .sub_(kMean)
                .div_(kStd);
  labels_ = torch::from_blob(labels.data(), {static_cast<std::int64_t>(label_dims[0])}, torch::kUInt8)
                .slice(0, 0, n)
                .to(torch::kInt64);
}

torch::data::Example<> Dataset::get(std::size_t index) {
  const auto i = static_cast<std::int64_t>(index);
  return {images_[i], labels_[i]};
}

}  // namespace fashion_mnist
