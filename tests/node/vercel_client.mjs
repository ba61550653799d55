#!/usr/bin/env node
// Vercel AI SDK (ai@7.0.173) UI-message-stream test client.
//
// Usage:
//   node vercel_client.mjs <url> [body]      body: JSON string, @file.json, or omitted
//   node vercel_client.mjs <url> --verbose   also prints every validated chunk to stderr
//   node vercel_client.mjs --batch <runs.json> [--verbose]
//     runs.json: [{"url": ..., "body": ...}, ...], run one after another in this one
//     process (the SDK loads once); stdout: a JSON array with, for each run,
//     {"status", "stdout", "stderr"}: what a single run exits with and prints.
//
// It POSTs the body *verbatim* (content-type: application/json) using the SDK's
// own DefaultChatTransport (the transport useChat uses by default). The transport
// parses the SSE response with parseJsonEventStream + uiMessageChunkSchema and
// throws on the first chunk that is not JSON / fails the schema. The chunk stream
// is then assembled with readUIMessageStream({ terminateOnError: true }), which
// runs the same processUIMessageStream state machine as useChat (it throws
// UIMessageStreamError on e.g. text-delta without text-start, and turns an
// {"type":"error"} chunk into an error).
//
// stdout: JSON array of the final assembled UIMessage(s) (one per distinct
//         assistant message id; normally exactly one).
//         Printed only on success; on failure the partial messages go to stderr.
// stderr: diagnostics.
// exit 0  = stream fully valid and ended without error
// exit 1  = usage / HTTP error (non-2xx, empty body)
// exit 2  = a chunk failed JSON parsing or uiMessageChunkSchema validation
// exit 3  = a chunk violated the client state machine (UIMessageStreamError)
// exit 4  = the server sent an {"type":"error","errorText":...} chunk
// exit 5  = any other stream error

import fs from 'node:fs';
import {
  DefaultChatTransport,
  readUIMessageStream,
  TypeValidationError,
  JSONParseError,
  APICallError,
} from 'ai';
import { batch, outputs } from './batch.mjs';

const args = process.argv.slice(2);
const verbose = args.includes('--verbose');
const batched = args.includes('--batch');
const positional = args.filter(a => !a.startsWith('--'));
if (!positional[0]) {
  console.error('usage: node vercel_client.mjs <url> [body-json | @file] [--verbose]');
  console.error('       node vercel_client.mjs --batch <runs.json> [--verbose]');
  process.exit(1);
}

// What useChat's DefaultChatTransport sends for sendMessage({ text: 'Hello' })
const DEFAULT_BODY = {
  id: 'chat-1',
  messages: [{ id: 'msg-user-1', role: 'user', parts: [{ type: 'text', text: 'Hello' }] }],
  trigger: 'submit-message',
  // messageId is undefined for a plain submit, so JSON.stringify omits it
};

// One run: POST `body` verbatim to `url`, read the response through the SDK; the exit status.
async function run(url, body, io) {
  const transport = new DefaultChatTransport({
    api: url,
    // Send the given body verbatim instead of the default {...body, id, messages, trigger, messageId}
    prepareSendMessagesRequest: () => ({ body }),
  });

  let serverErrorText;
  const messages = new Map(); // id -> last snapshot (insertion order = stream order)

  function classify(err) {
    if (serverErrorText != null) return 4;
    if (TypeValidationError.isInstance?.(err) || JSONParseError.isInstance?.(err)) return 2;
    if (err?.name === 'AI_UIMessageStreamError') return 3;
    if (APICallError.isInstance?.(err)) return 1;
    if (err?.name === 'AI_EmptyResponseBodyError') return 1;
    return 5;
  }

  try {
    const chunkStream = await transport.sendMessages({
      trigger: body.trigger ?? 'submit-message',
      chatId: body.id ?? 'chat',
      messageId: body.messageId,
      messages: body.messages ?? [],
      abortSignal: undefined,
    });

    let count = 0;
    const counted = chunkStream.pipeThrough(
      new TransformStream({
        transform(chunk, controller) {
          count++;
          if (verbose) io.err('chunk', JSON.stringify(chunk));
          if (chunk.type === 'error') serverErrorText = chunk.errorText;
          controller.enqueue(chunk);
        },
      }),
    );

    for await (const message of readUIMessageStream({
      stream: counted,
      terminateOnError: true,
    })) {
      messages.set(message.id, message);
    }
    io.err(`ok: ${count} valid chunks, ${messages.size} message(s)`);
    io.out(JSON.stringify([...messages.values()], null, 2) + '\n');
    return 0;
  } catch (err) {
    const code = classify(err);
    const kind = {
      1: 'http',
      2: 'chunk validation',
      3: 'stream state',
      4: 'server error chunk',
      5: 'stream',
    }[code];
    const msg = String(err?.message ?? err);
    // zod union errors list every alternative; keep stderr short unless --verbose
    io.err(`FAILED (${kind}): ${err?.name}: ${verbose ? msg : msg.slice(0, 400) + (msg.length > 400 ? ' …(truncated, use --verbose)' : '')}`);
    if (code === 4) io.err(`errorText: ${serverErrorText}`);
    if (messages.size > 0) io.err('partial messages: ' + JSON.stringify([...messages.values()]));
    return code;
  }
}

const read = arg => JSON.parse(arg.startsWith('@') ? fs.readFileSync(arg.slice(1), 'utf8') : arg);

if (batched) {
  await batch(positional[0], ({ url, body }, io) => run(url, body ?? DEFAULT_BODY, io));
} else {
  const [url, bodyArg] = positional;
  process.exit(await run(url, bodyArg == null ? DEFAULT_BODY : read(bodyArg), outputs(false)));
}
