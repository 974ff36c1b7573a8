/* server.h - `ingot --serve`: the OpenAI API, a chat page and Prometheus metrics over HTTP.
 *
 *   POST /v1/chat/completions   messages rendered with the model's chat template; stream or not
 *   POST /v1/completions        plain text completion; stream or not
 *   GET  /v1/models, /health, /metrics, and / (the chat page, embedded in the binary)
 *
 * HTTP is GNU libmicrohttpd's, a thread per connection; JSON is ingot's own parser (json.h). One
 * model runs one generation at a time: requests wait in a bounded FIFO queue for the one worker
 * thread that drives the engine, and get 503 with Retry-After when it is full. The worker never
 * waits on a client: it writes each request's text into memory that the client's connection
 * thread sends as the client takes it, and it stops a generation within a token of its client
 * hanging up. A request whose tokens start with the tokens in the cache (the next turn of a
 * conversation) feeds only the rest. */
#ifndef INGOT_SERVER_H
#define INGOT_SERVER_H

#include "engine.h"
#include "errors.h"
#include "sampler.h"

typedef struct {
    const char *host;        /* address to listen on: a name or a numeric IPv4/IPv6 address */
    int port;                /* 0: any free port (the one taken is printed) */
    int queue;               /* requests waiting for the model at most */
    int prompt_cache;        /* reuse the cached tokens a prompt starts with */
    int timeout_s;           /* a connection that sends or takes nothing this long is closed */
    const char *model_name;  /* what /v1/models lists and responses name */
    sampler_config sampling; /* what a request does not set: the command line's settings */
    int seed_given;          /* sampling.seed was given: requests without a seed use it */
    int max_tokens;          /* -n, or -1: a request without max_tokens stops at the end of its turn
                              * (chat, at most 1024 tokens) or after 16 tokens (completions) */
} server_config;

/* Serves until SIGINT or SIGTERM. Prints one line to stderr once it listens:
 * "ingot: serving MODEL on http://HOST:PORT/". Errors: ERR_IO when it cannot listen. */
err_code server_run(engine *e, const server_config *c);

#endif
