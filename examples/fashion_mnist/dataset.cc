// IDX reading through zlib (which reads plain files too); see dataset.h.
#include "dataset.h"

#include <zlib.h>

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

// Reads an IDX file: a big-endian header (magic, then one u32 per
// dimension) and the bytes.
std::vector<std::uint8_t> read_idx(const std::string& path, std::uint32_t magic, std::vector<std::uint32_t>& dims) {
  std::unique_ptr<gzFile_s, GzCloser> f(gzopen(path.c_str(), "rb"));
  if (!f) throw std::runtime_error("cannot open " + path);
  const auto read_u32 = [&] {
    unsigned char b[4];
    if (gzread(f.get(), b, 4) != 4) throw std::runtime_error(path + ": truncated header");
    return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) | b[3];
  };
  if (read_u32() != magic) throw std::runtime_error(path + ": not an IDX file of the expected kind");
  std::size_t total = 1;
  for (auto& d : dims) {
    d = read_u32();
    total *= d;
  }
  std::vector<std::uint8_t> data(total);
  std::size_t got = 0;
  while (got < total) {
    const int n = gzread(f.get(), data.data() + got, static_cast<unsigned>(std::min<std::size_t>(total - got, 1 << 30)));
    if (n <= 0) throw std::runtime_error(path + ": truncated data");
    got += static_cast<std::size_t>(n);
  }
  return data;
}

}  // namespace

Dataset::Dataset(const std::string& dir, bool train, std::size_t limit) {
  const std::string prefix = train ? "train" : "t10k";
  std::vector<std::uint32_t> image_dims(3), label_dims(1);
  auto pixels = read_idx(find_file(dir, prefix + "-images-idx3-ubyte"), 0x00000803, image_dims);
  auto labels = read_idx(find_file(dir, prefix + "-labels-idx1-ubyte"), 0x00000801, label_dims);
  if (image_dims[0] != label_dims[0]) throw std::runtime_error("Fashion-MNIST: image and label counts differ in " + dir);
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
