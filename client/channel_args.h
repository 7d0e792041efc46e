// The channel arguments of every channel that carries syncnorm rounds: the
// client's (client.h) and the relay's to its shards (relay/upstream.h).
#ifndef SYNCNORM_CLIENT_CHANNEL_ARGS_H_
#define SYNCNORM_CLIENT_CHANNEL_ARGS_H_

#include "grpcpp/support/channel_arguments.h"

namespace syncnorm {

// Keepalive pings every 10 s (5 s to answer), with or without calls, so a
// dead server is noticed within seconds on an idle stream; reconnects
// after 100 ms, backing off to 1 s, so a restarted server is reached
// quickly; answers up to 64 MiB; an 8 MiB HTTP/2 stream window and 1 MiB
// frames, so a large round's message (C = 8192: 128 KiB each way) needs no
// window-update round trip. A caller adds its own (the client its connect
// timeout).
grpc::ChannelArguments RoundChannelArguments();

}  // namespace syncnorm

#endif  // SYNCNORM_CLIENT_CHANNEL_ARGS_H_
