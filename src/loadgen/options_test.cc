#include "loadgen/options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace shoal::loadgen {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ParseShapeTest, NameAndDims) {
  auto s = ParseShape("image:1,8,8");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->name, "image");
  EXPECT_THAT(s->dims, ElementsAre(1, 8, 8));
  // Names may contain colons; the last one separates the dims.
  auto t = ParseShape("ns:input:16");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->name, "ns:input");
  EXPECT_THAT(t->dims, ElementsAre(16));
}

TEST(ParseShapeTest, RejectsBadInput) {
  for (const char* bad :
       {"image", "image:", ":1,2", "image:1,,2", "image:0", "image:-1", "image:a", "image:1.5"}) {
    auto s = ParseShape(bad);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  }
  EXPECT_THAT(ParseShape("image:1,x").status().message(), HasSubstr("'x'"));
}

TEST(ParseRangeTest, IntRanges) {
  EXPECT_THAT(*ParseIntRange("4"), ElementsAre(4));
  EXPECT_THAT(*ParseIntRange("1:4"), ElementsAre(1, 2, 3, 4));
  EXPECT_THAT(*ParseIntRange("1:16:4"), ElementsAre(1, 5, 9, 13));
  EXPECT_THAT(*ParseIntRange("4:16:4"), ElementsAre(4, 8, 12, 16));
}

TEST(ParseRangeTest, RateRanges) {
  EXPECT_THAT(*ParseRateRange("100:300:100"), ElementsAre(100.0, 200.0, 300.0));
  EXPECT_THAT(*ParseRateRange("0.5:1.5:0.5"), ElementsAre(0.5, 1.0, 1.5));
  EXPECT_THAT(*ParseRateRange("250.5"), ElementsAre(250.5));
}

TEST(ParseRangeTest, RejectsBadRanges) {
  for (const char* bad : {"", "0", "-1", "4:2", "1:2:0", "1:2:3:4", "a", "1:b", "1::2"}) {
    EXPECT_FALSE(ParseIntRange(bad).ok()) << bad;
  }
  EXPECT_FALSE(ParseIntRange("1.5").ok());
  EXPECT_FALSE(ParseRateRange("nan").ok());
  EXPECT_FALSE(ParseIntRange("1:100000").ok());  // over 1000 steps
  EXPECT_THAT(ParseIntRange("4:2").status().message(), HasSubstr("'4:2'"));
}

TEST(ParseHostPortTest, Forms) {
  struct Case {
    const char* text;
    int default_port;
    const char* host;
    int port;
  };
  for (const Case& c :
       {Case{"localhost:9000", 8000, "localhost", 9000}, Case{"10.0.0.1", 8001, "10.0.0.1", 8001},
        Case{"[::1]:8000", 1, "::1", 8000}, Case{"http://example.com:80", 1, "example.com", 80}}) {
    auto a = ParseHostPort(c.text, c.default_port);
    ASSERT_TRUE(a.ok()) << c.text;
    EXPECT_EQ(a->host, c.host) << c.text;
    EXPECT_EQ(a->port, c.port) << c.text;
  }
  EXPECT_FALSE(ParseHostPort("host:0", 1).ok());
  EXPECT_FALSE(ParseHostPort("host:70000", 1).ok());
  EXPECT_FALSE(ParseHostPort(":80", 1).ok());
  EXPECT_FALSE(ParseHostPort("[::1", 1).ok());
}

TEST(ValidateBenchOptionsTest, DefaultsAndErrors) {
  BenchOptions o;
  o.model = "m";
  ASSERT_TRUE(ValidateBenchOptions(&o).ok());
  EXPECT_THAT(o.concurrency, ElementsAre(1));

  BenchOptions both = o;
  both.request_rates = {10};
  EXPECT_THAT(ValidateBenchOptions(&both).message(), HasSubstr("not both"));

  BenchOptions no_model;
  EXPECT_THAT(ValidateBenchOptions(&no_model).message(), HasSubstr("--model"));

  BenchOptions batch = o;
  batch.batch_size = 0;
  EXPECT_THAT(ValidateBenchOptions(&batch).message(), HasSubstr("was 0"));

  BenchOptions pct = o;
  pct.percentile = 120;
  EXPECT_THAT(ValidateBenchOptions(&pct).message(), HasSubstr("--percentile"));
  pct.percentile = 0;  // given, not unset: refused too
  EXPECT_THAT(ValidateBenchOptions(&pct).message(), HasSubstr("--percentile"));

  BenchOptions late = o;
  late.late_threshold_us = -5;
  EXPECT_THAT(ValidateBenchOptions(&late).message(), HasSubstr("--late-threshold-us"));

  BenchOptions burst = o;
  burst.distribution = Distribution::kBurst;
  burst.burst_on_fraction = 0;
  EXPECT_THAT(ValidateBenchOptions(&burst).message(), HasSubstr("--burst-on-fraction"));
  burst.burst_on_fraction = 1.5;
  EXPECT_THAT(ValidateBenchOptions(&burst).message(), HasSubstr("--burst-on-fraction"));
  burst.burst_on_fraction = 0.5;
  burst.burst_period_ms = 0;
  EXPECT_THAT(ValidateBenchOptions(&burst).message(), HasSubstr("--burst-period-ms"));
  burst.burst_period_ms = 1000;
  EXPECT_TRUE(ValidateBenchOptions(&burst).ok());

  BenchOptions interval = o;
  interval.measurement_interval_ms = 0;
  EXPECT_FALSE(ValidateBenchOptions(&interval).ok());

  BenchOptions twice = o;
  twice.shapes = {{"a", {1}}, {"a", {2}}};
  EXPECT_THAT(ValidateBenchOptions(&twice).message(), HasSubstr("given twice"));
}

}  // namespace
}  // namespace shoal::loadgen
