// OutputRelay; see output_relay.h.
#include "run/output_relay.h"

namespace lockstep::cli {

OutputRelay::OutputRelay(std::FILE* out, std::FILE* log, std::string prefix, std::size_t keep_lines)
    : out_(out), log_(log), prefix_(std::move(prefix)), keep_(keep_lines) {}

void OutputRelay::feed(const char* data, std::size_t len) {
  partial_.append(data, len);
  std::size_t start = 0;
  for (;;) {
    const std::size_t end = partial_.find_first_of("\r\n", start);
    if (end == std::string::npos) break;
    if (partial_[end] == '\r' && end + 1 == partial_.size()) break;  // CR or CRLF? wait for the next byte
    if (partial_[end] == '\r' && end + 1 < partial_.size() && partial_[end + 1] == '\n') {
      emit(partial_.substr(start, end - start));  // a CRLF line
      start = end + 2;
    } else if (partial_[end] == '\r') {
      // A progress bar redrawing its line: pass it through as a redraw,
      // without logging every frame.
      if (out_) {
        std::fprintf(out_, "%s%s\r", prefix_.c_str(), partial_.substr(start, end - start).c_str());
        std::fflush(out_);
      }
      start = end + 1;
    } else {
      emit(partial_.substr(start, end - start));
      start = end + 1;
    }
  }
  partial_.erase(0, start);
  // A rank printing a huge line without newlines (a progress bar with \r)
  // must not grow the buffer without bound: pass long fragments through.
  if (partial_.size() > 64 * 1024) {
    emit(partial_);
    partial_.clear();
  }
}

void OutputRelay::finish() {
  if (!partial_.empty()) emit(partial_);
  partial_.clear();
  if (out_) std::fflush(out_);
  if (log_) std::fflush(log_);
}

void OutputRelay::duplicate_matching(std::FILE* file, const std::vector<std::string>* filters,
                                     std::string rank_prefix) {
  matching_ = file;
  filters_ = filters;
  rank_prefix_ = std::move(rank_prefix);
}

void OutputRelay::emit(const std::string& line) {
  if (matching_ && filters_) {
    for (const auto& filter : *filters_) {
      if (line.find(filter) == std::string::npos) continue;
      std::fprintf(matching_, "%s%s\n", rank_prefix_.c_str(), line.c_str());
      std::fflush(matching_);
      break;
    }
  }
  if (out_) {
    std::fprintf(out_, "%s%s\n", prefix_.c_str(), line.c_str());
    std::fflush(out_);
  }
  if (log_) std::fprintf(log_, "%s\n", line.c_str());
  last_.push_back(line);
  if (last_.size() > keep_) last_.pop_front();
}

}  // namespace lockstep::cli
