// Fashion-MNIST from the IDX files (plain or gzip-compressed, as Debian's
// dataset-fashion-mnist ships them), as a torch::data dataset of normalised
// 1x28x28 images and class labels. Loaded once into memory; read-only after.
#pragma once

#include <torch/torch.h>

#include <string>

namespace fashion_mnist {

class Dataset : public torch::data::datasets::Dataset<Dataset> {
 public:
  // Reads <dir>/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]. `limit`
  // keeps only the first samples (0: all). Throws std::runtime_error, one
  // sentence naming the file, the problem and what to do, if a file is
  // missing, not IDX, truncated, longer than its header says, holds no
  // samples, images other than 28x28 or labels outside 0..9.
  Dataset(const std::string& dir, bool train, std::size_t limit = 0);

  torch::data::Example<> get(std::size_t index) override;
  torch::optional<std::size_t> size() const override { return static_cast<std::size_t>(images_.size(0)); }

 private:
  torch::Tensor images_;  // float [N, 1, 28, 28], normalised
  torch::Tensor labels_;  // int64 [N]
};

}  // namespace fashion_mnist
