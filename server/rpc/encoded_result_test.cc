#include "server/rpc/encoded_result.h"

#include <vector>

#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "gtest/gtest.h"
#include "server/domain/contribution.h"
#include "syncnorm/v1/aggregator.pb.h"

namespace syncnorm {
namespace {

Contribution Key(int layer, int64_t step) {
  Contribution key;
  key.job_id = "wide";
  key.layer = layer;
  key.step = step;
  key.phase = Phase::kForward;
  return key;
}

RoundOutcome Outcome(int channels, uint64_t serial) {
  RoundOutcome o;
  o.moments.count = 12345;
  for (int c = 0; c < channels; ++c) {
    o.moments.mean.push_back(0.5 * c);
    o.moments.var.push_back(1.0 + c);
  }
  o.version = 7;
  o.serial = serial;
  return o;
}

// Where the buffer's bytes are: the same pointers mean the same memory.
std::vector<const uint8_t*> Storage(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(b.Dump(&slices).ok());
  std::vector<const uint8_t*> at;
  for (const grpc::Slice& s : slices) at.push_back(s.begin());
  return at;
}

v1::RoundResult Decode(grpc::ByteBuffer b) {
  v1::RoundResult r;
  EXPECT_TRUE(
      grpc::SerializationTraits<v1::RoundResult>::Deserialize(&b, &r).ok());
  return r;
}

TEST(EncodedResultTest, ARoundsCallersShareOneEncoding) {
  const RoundOutcome outcome = Outcome(2048, NextOutcomeSerial());
  const grpc::ByteBuffer first = EncodedResult(Key(3, 9), outcome);
  const grpc::ByteBuffer second = EncodedResult(Key(3, 9), outcome);
  EXPECT_EQ(Storage(first), Storage(second))
      << "the second caller's answer was encoded again";
  const v1::RoundResult r = Decode(second);
  EXPECT_EQ(r.job_id(), "wide");
  EXPECT_EQ(r.layer(), 3);
  EXPECT_EQ(r.step(), 9);
  EXPECT_EQ(r.version(), 7);
  ASSERT_EQ(r.moments().mean_size(), 2048);
  EXPECT_EQ(r.moments().count(), 12345);
  EXPECT_EQ(r.moments().mean(2047), 0.5 * 2047);
  EXPECT_EQ(r.moments().var(5), 6.0);
}

TEST(EncodedResultTest, AnotherOutcomeOrKeyIsEncodedAfresh) {
  const RoundOutcome a = Outcome(16, NextOutcomeSerial());
  const RoundOutcome b = Outcome(16, NextOutcomeSerial());
  const grpc::ByteBuffer from_a = EncodedResult(Key(0, 1), a);
  EXPECT_NE(Storage(from_a), Storage(EncodedResult(Key(0, 1), b)));
  // The same outcome echoed for another key (no round does this, but the
  // bytes must say what they answer).
  EXPECT_EQ(Decode(EncodedResult(Key(0, 2), a)).step(), 2);
  // An outcome without a serial (one caller's) is never shared.
  const RoundOutcome single = Outcome(16, 0);
  EXPECT_NE(Storage(EncodedResult(Key(0, 1), single)),
            Storage(EncodedResult(Key(0, 1), single)));
}

}  // namespace
}  // namespace syncnorm
