// File and shared-memory faults through an injected Os: a full disk, a
// short write, a failed flush or rename while saving a file (checkpoints,
// flight records, traces), and a full /dev/shm while creating a region.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "comm/shm/region.h"
#include "common/file.h"
#include "faults/faulty_os.h"
#include "lockstep/error.h"

namespace lockstep {
namespace {

using testing::FaultyOs;
using Call = FaultyOs::Call;
namespace fs = std::filesystem;

class FileFaults : public ::testing::Test {
 protected:
  FileFaults() {
    char tmpl[] = "/tmp/lockstep-file-faults-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    path_ = dir_ + "/model.ckpt";
  }
  ~FileFaults() override { fs::remove_all(dir_); }

  std::string contents() const {
    std::ifstream in(path_, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  std::vector<std::string> files() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    return names;
  }

  std::string dir_, path_;
  FaultyOs os_;
};

// The disk fills up part-way through a save: a clear error naming the
// file, no partial file left anywhere, and the previous save intact.
TEST_F(FileFaults, FullDiskLeavesThePreviousFileAndNoPart) {
  write_file_atomically(path_, "the previous checkpoint", FileSync::to_disk);
  os_.shorten(Call::write, 1, 4096);
  os_.fail(Call::write, 3, ENOSPC);  // after 8 KiB of 64
  const std::string next(64 << 10, 'n');
  try {
    write_file_atomically(path_, next, FileSync::to_disk, os_);
    FAIL() << "no Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "cannot write " + temporary_path(path_, ::getpid()) +
                                         ": No space left on device; free space on that file system or write "
                                         "elsewhere");
  }
  EXPECT_EQ(os_.calls(Call::write), 3);
  EXPECT_EQ(os_.calls(Call::rename), 0);
  EXPECT_EQ(contents(), "the previous checkpoint");
  EXPECT_EQ(files(), std::vector<std::string>{"model.ckpt"});
}

// A disk that accepts nothing at all (write returns 0) is a full disk too,
// not an endless loop.
TEST_F(FileFaults, WriteThatTakesNothingIsAFullDisk) {
  os_.shorten(Call::write, 1, 0);
  EXPECT_THROW(write_file_atomically(path_, "abc", FileSync::none, os_), Error);
  EXPECT_EQ(os_.calls(Call::write), 1);
  EXPECT_TRUE(files().empty());
}

TEST_F(FileFaults, ShortWritesStillWriteEverything) {
  os_.shorten(Call::write, 1, 1000);
  std::string data(10000, '\0');
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  write_file_atomically(path_, data, FileSync::none, os_);
  EXPECT_EQ(os_.calls(Call::write), 10);
  EXPECT_EQ(contents(), data);
  EXPECT_EQ(files(), std::vector<std::string>{"model.ckpt"});
}

TEST_F(FileFaults, FailedFlushLeavesThePreviousFile) {
  write_file_atomically(path_, "old", FileSync::none);
  os_.fail(Call::fsync, 1, EIO);
  try {
    write_file_atomically(path_, "new", FileSync::to_disk, os_);
    FAIL() << "no Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "cannot flush " + temporary_path(path_, ::getpid()) + ": Input/output error");
  }
  EXPECT_EQ(contents(), "old");
  EXPECT_EQ(files(), std::vector<std::string>{"model.ckpt"});
}

TEST_F(FileFaults, FailedRenameLeavesThePreviousFileAndNoTemporary) {
  write_file_atomically(path_, "old", FileSync::none);
  os_.fail(Call::rename, 1, EACCES);
  try {
    write_file_atomically(path_, "new", FileSync::none, os_);
    FAIL() << "no Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "cannot rename " + temporary_path(path_, ::getpid()) + " to " + path_ + ": Permission denied");
  }
  EXPECT_EQ(contents(), "old");
  EXPECT_EQ(files(), std::vector<std::string>{"model.ckpt"});
}

// A durable save flushes the data before the rename and the directory
// after it, so a power loss leaves the old file or the new one.
TEST_F(FileFaults, DurableSaveFlushesTheFileAndItsDirectory) {
  write_file_atomically(path_, "data", FileSync::to_disk, os_);
  EXPECT_EQ(os_.calls(Call::fsync), 2);
  EXPECT_EQ(contents(), "data");
  write_file_atomically(path_, "more", FileSync::none, os_);
  EXPECT_EQ(os_.calls(Call::fsync), 2);
}

// An error raised while producing the contents (a serializer failing)
// leaves no temporary either.
TEST_F(FileFaults, FailingProducerLeavesNoTemporary) {
  EXPECT_THROW(write_file_atomically(path_,
                                     [](const ByteWriter& write) {
                                       write("part", 4);
                                       throw InvalidArgument("cannot serialize");
                                     }),
               InvalidArgument);
  EXPECT_TRUE(files().empty());
}

// /dev/shm is full: creating a region is a ConfigError that says how to
// make room, and no segment is left behind.
TEST(ShmFaults, FullDevShmIsAConfigErrorAndLeavesNoSegment) {
  FaultyOs os;
  os.fail(Call::allocate, 1, ENOSPC);
  const std::string name = "/lockstep.faults-test.region." + std::to_string(::getpid());
  try {
    shm::Region::create(name, 8 << 20, os);
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("/dev/shm has no room for 8 more MiB (" + name + ": No space left on device)"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("--shm-size"), std::string::npos) << what;
  }
  EXPECT_FALSE(fs::exists("/dev/shm" + name));
}

TEST(ShmFaults, RegionCreatedThroughAnOsIsUnlinkedThroughIt) {
  FaultyOs os;
  const std::string name = "/lockstep.faults-test.ok." + std::to_string(::getpid());
  {
    shm::Region region = shm::Region::create(name, 4096, os);
    EXPECT_TRUE(fs::exists("/dev/shm" + name));
    EXPECT_EQ(os.calls(Call::allocate), 1);
    region.data()[4095] = std::byte{1};
  }
  EXPECT_FALSE(fs::exists("/dev/shm" + name));
}

}  // namespace
}  // namespace lockstep
