// HTTP/1.1 head parsing, path splitting, body buffers and response heads.
#include "proto/http_message.h"

#include <gtest/gtest.h>

#include <cstring>

namespace shoal::proto {
namespace {

HttpError Parse(std::string_view block, HttpRequestHead* head) {
  return ParseRequestHead(block, head);
}

TEST(HttpMessageTest, ParsesAnInferRequestHead) {
  HttpRequestHead h;
  auto err = Parse(
      "POST /v2/models/m%20x/infer?a=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\n"
      "Inference-Header-Content-Length:  5 \r\nExpect:\r\n\r\n",
      &h);
  ASSERT_TRUE(err.ok()) << err.message;
  EXPECT_EQ(h.method, "POST");
  EXPECT_EQ(h.path, "/v2/models/m%20x/infer");
  EXPECT_EQ(h.query, "a=1");
  EXPECT_EQ(h.minor_version, 1);
  EXPECT_EQ(h.content_length, 12);
  EXPECT_TRUE(h.keep_alive);
  EXPECT_FALSE(h.expect_continue);  // libcurl's empty Expect:
  ASSERT_NE(h.Find("inference-header-content-length"), nullptr);
  EXPECT_EQ(*h.Find("inference-header-content-length"), "5");
  EXPECT_EQ(h.Find("content-type"), nullptr);
}

TEST(HttpMessageTest, KeepAliveRules) {
  HttpRequestHead h;
  ASSERT_TRUE(Parse("GET / HTTP/1.0\r\n\r\n", &h).ok());
  EXPECT_FALSE(h.keep_alive);
  ASSERT_TRUE(Parse("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", &h).ok());
  EXPECT_TRUE(h.keep_alive);
  h = {};
  ASSERT_TRUE(Parse("GET / HTTP/1.1\r\nConnection: foo, close\r\n\r\n", &h).ok());
  EXPECT_FALSE(h.keep_alive);
  h = {};
  ASSERT_TRUE(
      Parse("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n", &h)
          .ok());
  EXPECT_TRUE(h.chunked);
  EXPECT_TRUE(h.expect_continue);
  h = {};
  ASSERT_TRUE(Parse("GET http://host:8000/v2/health/live HTTP/1.1\r\n\r\n", &h).ok());
  EXPECT_EQ(h.path, "/v2/health/live");
}

TEST(HttpMessageTest, RejectsAmbiguousOrMalformedHeads) {
  struct Case {
    const char* head;
    int status;
  } cases[] = {
      {"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nContent-Length: 1 2\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501},
      {"GET / HTTP/1.1\r\nX: a\r\n b\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nX : a\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nNoColon\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nX: a\x01\r\n\r\n", 400},
      {"GET / HTTP/2.0\r\n\r\n", 505},
      {"GET / FTP/1.1\r\n\r\n", 400},
      {"GET  / HTTP/1.1\r\n\r\n", 400},
      {"G(T / HTTP/1.1\r\n\r\n", 400},
      {"GET nopath HTTP/1.1\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nExpect: magic\r\n\r\n", 417},
      {"GET / HTTP/1.1\r\n\r", 400},
  };
  for (const auto& c : cases) {
    HttpRequestHead h;
    EXPECT_EQ(Parse(c.head, &h).status, c.status) << c.head;
  }
}

TEST(HttpMessageTest, SplitsAndDecodesPaths) {
  auto s = SplitPath("/v2//models/my%2Fmodel/versions/3/");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, (std::vector<std::string>{"v2", "models", "my/model", "versions", "3"}));
  EXPECT_FALSE(SplitPath("/v2/a%2").ok());
  EXPECT_FALSE(SplitPath("/v2/a%zz").ok());
  EXPECT_FALSE(SplitPath("/v2/a%00b").ok());
  EXPECT_TRUE(SplitPath("/")->empty());
}

TEST(HttpMessageTest, BodyBufferAlignsTheChosenByteAndPads) {
  for (size_t at : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{100}}) {
    auto b = BodyBuffer::Create(200, at);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data() + at) % BodyBuffer::kAlignment, 0u) << at;
    b->set_size(3);
    std::memcpy(b->data(), "abc", 3);
    b->Reserve(5000);
    EXPECT_EQ(b->view(), "abc");
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data() + at) % BodyBuffer::kAlignment, 0u) << at;
    for (size_t i = 0; i < BodyBuffer::kPadding; ++i) EXPECT_EQ(b->data()[b->capacity() + i], 0);
  }
}

TEST(HttpMessageTest, SerializesResponseHeads) {
  HttpResponse r = HttpResponse::Json(429, R"({"error":"x"})");
  r.headers.emplace_back("Retry-After", "1");
  EXPECT_EQ(
      SerializeResponseHead(r, true, 1),
      "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nContent-Length: 13\r\n"
      "Retry-After: 1\r\n\r\n");
  EXPECT_EQ(SerializeResponseHead(HttpResponse::Empty(200), false, 1),
            "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(SerializeResponseHead(HttpResponse::Empty(200), true, 0),
            "HTTP/1.0 200 OK\r\nContent-Length: 0\r\nConnection: keep-alive\r\n\r\n");
}

ChunkedDecoder::Result FeedBytewise(ChunkedDecoder& d, std::string_view in, BodyBuffer* body,
                                    HttpError* err) {
  // One byte at a time, as the worst network would deliver it.
  std::string pending;
  ChunkedDecoder::Result r = ChunkedDecoder::Result::kNeedMore;
  for (char c : in) {
    pending.push_back(c);
    size_t consumed = 0;
    r = d.Feed(pending, &consumed, body, err);
    pending.erase(0, consumed);
    if (r != ChunkedDecoder::Result::kNeedMore) break;
  }
  return r;
}

TEST(HttpMessageTest, ChunkedDecoder) {
  const std::string wire =
      "4;ext=1\r\nWiki\r\n6\r\npedia \r\nE\r\nin \r\n\r\nchunks.\r\n0\r\nX-T: 1\r\n\r\n";
  {
    ChunkedDecoder d(1000, 100);
    auto body = BodyBuffer::Create(4);
    HttpError err;
    size_t consumed = 0;
    EXPECT_EQ(d.Feed(wire + "NEXT", &consumed, body.get(), &err), ChunkedDecoder::Result::kDone);
    EXPECT_EQ(consumed, wire.size());
    EXPECT_EQ(body->view(), "Wikipedia in \r\n\r\nchunks.");
  }
  {
    ChunkedDecoder d(1000, 100);
    auto body = BodyBuffer::Create(0);
    HttpError err;
    EXPECT_EQ(FeedBytewise(d, wire, body.get(), &err), ChunkedDecoder::Result::kDone);
    EXPECT_EQ(body->view(), "Wikipedia in \r\n\r\nchunks.");
  }
  struct Case {
    std::string wire;
    int status;
  } bad[] = {
      {"zz\r\n", 400},  {"4\r\nWikiXX", 400},          {"ffffffffffffffff\r\n", 400},
      {"100\r\n", 413}, {std::string(2000, '1'), 400}, {"0\r\n" + std::string(200, 'x'), 431}};
  for (const auto& c : bad) {
    ChunkedDecoder d(100, 100);
    auto body = BodyBuffer::Create(0);
    HttpError err;
    size_t consumed = 0;
    EXPECT_EQ(d.Feed(c.wire, &consumed, body.get(), &err), ChunkedDecoder::Result::kError)
        << c.wire;
    EXPECT_EQ(err.status, c.status) << c.wire;
  }
}

// A client that ends lines with a bare LF never sends "\r\n\r\n": its head must be
// refused as soon as the first such line is in, not waited for until a timeout.
TEST(HttpMessageTest, FindHeadEndRefusesBareLineFeeds) {
  const std::string good = "GET / HTTP/1.1\r\nHost: a\r\n\r\nNEXT";
  EXPECT_EQ(FindHeadEnd(good, 0), static_cast<int64_t>(good.size() - 4));
  // Byte by byte, resuming where the last call stopped: complete only at the blank line.
  size_t scanned = 0;
  for (size_t n = 1; n <= good.size(); ++n) {
    const int64_t end = FindHeadEnd(std::string_view(good).substr(0, n), scanned);
    if (n < good.size() - 4) {
      EXPECT_EQ(end, 0) << n;
      scanned = n;
    } else {
      EXPECT_EQ(end, static_cast<int64_t>(good.size() - 4)) << n;
    }
  }
  EXPECT_EQ(FindHeadEnd("GET / HTTP/1.1\nHost: a\n\n", 0), -1);
  EXPECT_EQ(FindHeadEnd("GET / HTTP/1.1\r\nHost: a\n", 0), -1);
  EXPECT_EQ(FindHeadEnd("GET / HTTP/1.1\r\nHost: a\r\n\n", 0), -1);
  EXPECT_EQ(FindHeadEnd("\n", 0), -1);
  EXPECT_EQ(FindHeadEnd("GET / HTTP/1.1\r\nHost: a", 0), 0);
  // A bare LF after bytes already scanned is still found.
  EXPECT_EQ(FindHeadEnd("GET / HTTP/1.1\r\nHost: a\n", 23), -1);
}

TEST(HttpMessageTest, ChunkedDecoderRefusesBareLineFeeds) {
  for (const std::string wire :
       {"5\nhello\r\n0\r\n\r\n", "5\r\nhello\r\n0\n\n", "5\r\nhello\r\n0\r\nX-T: 1\n\r\n"}) {
    ChunkedDecoder d(100, 100);
    auto body = BodyBuffer::Create(0);
    HttpError err;
    size_t consumed = 0;
    EXPECT_EQ(d.Feed(wire, &consumed, body.get(), &err), ChunkedDecoder::Result::kError) << wire;
    EXPECT_EQ(err.status, 400) << wire;
    EXPECT_NE(err.message.find("bare LF"), std::string::npos) << err.message;
  }
}

// A chunk that declares 60 MB and sends 10 bytes once made the decoder reserve the 60 MB.
TEST(HttpMessageTest, ChunkedDecoderGrowsWithTheDataNotTheDeclaredSize) {
  ChunkedDecoder d(64 << 20, 100);
  auto body = BodyBuffer::Create(0);
  HttpError err;
  size_t consumed = 0;
  EXPECT_EQ(d.Feed("3938700\r\n0123456789", &consumed, body.get(), &err),
            ChunkedDecoder::Result::kNeedMore);
  EXPECT_EQ(body->view(), "0123456789");
  EXPECT_LT(body->capacity(), size_t{1} << 10);
}

TEST(HttpMessageTest, ParseDecimal) {
  EXPECT_EQ(ParseDecimal("0"), 0);
  EXPECT_EQ(ParseDecimal("123"), 123);
  EXPECT_EQ(ParseDecimal(""), -1);
  EXPECT_EQ(ParseDecimal("+1"), -1);
  EXPECT_EQ(ParseDecimal("1a"), -1);
  EXPECT_EQ(ParseDecimal("9999999999999999999"), -1);
}

TEST(HttpMessageTest, ParsesAResponseHead) {
  HttpResponseHead h;
  auto err = ParseResponseHead(
      "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 2\r\nContent-Length: 17\r\n"
      "Connection: close\r\n\r\n",
      &h);
  ASSERT_TRUE(err.ok()) << err.message;
  EXPECT_EQ(h.status, 429);
  EXPECT_EQ(h.reason, "Too Many Requests");
  EXPECT_EQ(h.content_length, 17);
  EXPECT_FALSE(h.keep_alive);
  ASSERT_NE(h.Find("retry-after"), nullptr);
  EXPECT_EQ(*h.Find("retry-after"), "2");

  ASSERT_TRUE(ParseResponseHead("HTTP/1.0 204\r\n\r\n", &h).ok());
  EXPECT_EQ(h.status, 204);
  EXPECT_EQ(h.reason, "");
  EXPECT_FALSE(h.keep_alive);  // HTTP/1.0 without keep-alive
  EXPECT_FALSE(h.has_content_length);
}

TEST(HttpMessageTest, RefusesMalformedResponseHeads) {
  HttpResponseHead h;
  for (std::string_view bad : {
           "HTTP/2 200 OK\r\n\r\n",     // version
           "HTTP/1.1 20 OK\r\n\r\n",    // two digits
           "HTTP/1.1 2000 OK\r\n\r\n",  // four digits
           "ICY 200 OK\r\n\r\n",        // not HTTP
           "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
           "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
           "HTTP/1.1 200 OK\r\n folded: x\r\n\r\n",
           "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n",  // incomplete
       }) {
    EXPECT_FALSE(ParseResponseHead(bad, &h).ok()) << bad;
  }
}

TEST(HttpMessageTest, SerializesARequestHeadTheParserReadsBack) {
  const std::string wire = SerializeRequestHead(
      "POST", "/v2/models/m/infer", {{"Host", "127.0.0.1:8000"}, {"Content-Length", "4"}});
  EXPECT_EQ(
      wire,
      "POST /v2/models/m/infer HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nContent-Length: 4\r\n\r\n");
  HttpRequestHead h;
  ASSERT_TRUE(ParseRequestHead(wire, &h).ok());
  EXPECT_EQ(h.method, "POST");
  EXPECT_EQ(h.content_length, 4);
}

TEST(HttpMessageTest, ReaderTakesResponsesByteByByteAndKeepsWhatFollows) {
  const std::string wire =
      "HTTP/1.1 100 Continue\r\n\r\n"
      "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
      "HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}";
  HttpResponseReader r;
  size_t i = 0;
  HttpResponseReader::State st = HttpResponseReader::State::kIncomplete;
  while (st == HttpResponseReader::State::kIncomplete && i < wire.size()) {
    st = r.Feed(std::string_view(wire).substr(i++, 1));
  }
  ASSERT_EQ(st, HttpResponseReader::State::kDone) << r.error();
  EXPECT_EQ(r.status(), 200);
  EXPECT_EQ(r.body(), "hello");
  EXPECT_TRUE(r.head().keep_alive);
  // The rest arrives in one read, and the reader is moved on to the next response.
  r.Feed(std::string_view(wire).substr(i));
  ASSERT_EQ(r.Next(), HttpResponseReader::State::kDone) << r.error();
  EXPECT_EQ(r.status(), 404);
  EXPECT_EQ(r.body(), "{}");
  EXPECT_FALSE(r.head().keep_alive);
  EXPECT_EQ(r.Next(), HttpResponseReader::State::kIncomplete);
}

TEST(HttpMessageTest, ReaderDecodesChunkedBodiesAndCanSkipBodies) {
  const std::string wire =
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
  HttpResponseReader keep;
  ASSERT_EQ(keep.Feed(wire), HttpResponseReader::State::kDone) << keep.error();
  EXPECT_EQ(keep.body(), "abcde");

  HttpResponseReader skip(/*keep_body=*/false);
  ASSERT_EQ(skip.Feed("HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nabc"),
            HttpResponseReader::State::kIncomplete);
  ASSERT_EQ(skip.Feed("def"), HttpResponseReader::State::kDone);
  EXPECT_EQ(skip.body(), "");
}

TEST(HttpMessageTest, ReaderReportsErrorsAndBoundsTheHead) {
  HttpResponseReader r;
  EXPECT_EQ(r.Feed("HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n"),
            HttpResponseReader::State::kError);
  EXPECT_NE(r.error().find("Content-Length"), std::string::npos) << r.error();

  HttpResponseReader big;
  EXPECT_EQ(big.Feed("HTTP/1.1 200 OK\r\nX: " + std::string(70 * 1024, 'a')),
            HttpResponseReader::State::kError);

  // A declared length is not allocated up front, and a kept body is bounded (found by the
  // fuzzer: a head claiming ~200 TB made the reader reserve it).
  HttpResponseReader huge(/*keep_body=*/true, /*max_body_bytes=*/1 << 20);
  EXPECT_EQ(huge.Feed("HTTP/1.1 200 OK\r\nContent-Length: 210000000000000\r\n\r\nab"),
            HttpResponseReader::State::kError);
  EXPECT_NE(huge.error().find("larger than the limit"), std::string::npos) << huge.error();
  HttpResponseReader skipped(/*keep_body=*/false, /*max_body_bytes=*/4);
  EXPECT_EQ(skipped.Feed("HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nabcdef"),
            HttpResponseReader::State::kDone);

  HttpResponseReader chunk(/*keep_body=*/true, /*max_body_bytes=*/4);
  EXPECT_EQ(chunk.Feed("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n"),
            HttpResponseReader::State::kError);
  // Reset starts afresh.
  chunk.Reset();
  EXPECT_EQ(chunk.Feed("HTTP/1.1 204 No Content\r\n\r\n"), HttpResponseReader::State::kDone);
  EXPECT_EQ(chunk.status(), 204);
}

}  // namespace
}  // namespace shoal::proto
