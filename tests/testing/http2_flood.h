// A raw HTTP/2 client that floods one connection with gRPC requests, each
// sent complete (HEADERS, then DATA with END_STREAM) and, for the "rapid
// reset" attack (CVE-2023-44487), reset at once (RST_STREAM CANCEL). It
// speaks just enough HTTP/2 to be that attacker: literal HPACK headers, the
// connection's flow-control window honoured (or the server would close the
// connection for that alone), the server's SETTINGS acknowledged only when
// asked to (an attacker need not, and limits the server has not seen
// acknowledged do not bind a peer).
#ifndef SYNCNORM_TESTS_TESTING_HTTP2_FLOOD_H_
#define SYNCNORM_TESTS_TESTING_HTTP2_FLOOD_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace syncnorm::testing {

struct Http2FloodOptions {
  // The server, 127.0.0.1:port (plaintext, HTTP/2 prior knowledge).
  int port = 0;
  // The method, e.g. "/syncnorm.v1.Aggregator/GetJob".
  std::string path;
  // The serialized request message; each request carries it.
  std::string message;
  // Extra request headers, e.g. {"authorization", "Bearer ..."}.
  std::vector<std::pair<std::string, std::string>> metadata;
  // Requests to send; stops earlier when the server closes the connection.
  int requests = 1000;
  // Reset each request right after sending it.
  bool reset = true;
  // Acknowledge the server's SETTINGS.
  bool ack_settings = false;
  // The first request's header fields enter HPACK's dynamic table and every
  // later request names them by index: a request of a few dozen bytes.
  bool index_headers = false;
  // A paced flood: after every `burst` requests (0: none) the client sends
  // what it has and waits `pause`, so the server's socket runs dry between
  // bursts (a client on a slower link, or one that keeps under a watchdog
  // of the server's reading).
  int burst = 0;
  absl::Duration pause = absl::Milliseconds(2);
  // The flood gives up (and reports what it sent) after this long.
  absl::Duration timeout = absl::Seconds(60);
  // How long the connection stays open after the last request: the server
  // holds whatever the flood left it meanwhile.
  absl::Duration hold_open = absl::Seconds(1);
};

struct Http2FloodResult {
  int sent = 0;              // requests written in full
  int responses = 0;         // response HEADERS frames received
  int resets = 0;            // RST_STREAM frames received from the server
  bool goaway = false;       // the server sent GOAWAY
  std::string goaway_debug;  // its debug data
  bool closed = false;       // the server closed or reset the connection
  absl::Duration took;       // from connecting to the last request written
};

// Connects, floods and closes. An error only when it cannot connect.
absl::StatusOr<Http2FloodResult> FloodHttp2(const Http2FloodOptions& options);

}  // namespace syncnorm::testing

#endif  // SYNCNORM_TESTS_TESTING_HTTP2_FLOOD_H_
