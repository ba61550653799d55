#!/usr/bin/env node
// Vercel AI SDK (ai@7) resumable streams, the way useChat({resume: true}) does it, without React.
//
// Usage:
//   node vercel_resume.mjs <url> <chat-id> <text> <cut> <mode> <open-url>
//     cut:  the number of SSE events the first response delivers before its connection drops
//           ("3.5": three, then half of the fourth)
//     mode: "drop"   the same Chat resumes (chat.resumeStream(): the state the dropped response
//                    left is what the SDK keeps for it);
//           "reload" a new Chat with the same id and the user's message (a reloaded page)
//                    resumes, as useChat({resume: true}) does when it mounts;
//           "none"   no message is sent: a new Chat resumes a chat with no active stream.
//     open-url: POSTed once the resume request was answered (the test server's gate: the run
//               goes on to its end only once the resume is reading it).
//
// A Chat (the SDK's AbstractChat over a plain state, as useChat's Chat is over React's) with the
// SDK's DefaultChatTransport: its resume is `GET <url>/<chat-id>/stream` (reconnectToStream), 204
// for "nothing to resume", and a replay from the start (resumeStreamIsReplay: the message is
// rebuilt from its first `start` chunk). Every chunk is validated (uiMessageChunkSchema) and run
// through processUIMessageStream, as in useChat. The drop: the response's body is cut after
// `cut` events and fails as a dropped connection does in a browser (a TypeError "network error":
// the SDK marks the response resumable) and the connection is closed.
//
// stdout: JSON {cut: messages after the drop, cutStatus, final: messages at the end, status,
//               error, errors, requests: [[method, url, status]], chunks: events delivered before the cut}
// exit 0 ok | 1 usage | 2 the chat ended in error | 5 other
//
//   node vercel_resume.mjs --batch <runs.json>
//     runs.json: a list of the arguments above, one list per run; the runs go at once in this one
//     process (the SDK loads once); stdout: a JSON array with, for each run, {"status", "stdout",
//     "stderr"}: what a single run exits with and prints.

import { AbstractChat, DefaultChatTransport } from 'ai';
import { batch, outputs } from './batch.mjs';

class PlainState {
  constructor(messages = []) {
    this.status = 'ready';
    this.error = undefined;
    this.messages = messages;
  }
  pushMessage(message) {
    this.messages = this.messages.concat(message);
  }
  popMessage() {
    this.messages = this.messages.slice(0, -1);
  }
  replaceMessage(index, message) {
    this.messages = [...this.messages.slice(0, index), message, ...this.messages.slice(index + 1)];
  }
  snapshot(thing) {
    return structuredClone(thing);
  }
}

class Chat extends AbstractChat {
  constructor({ messages, ...init }) {
    super({ ...init, state: new PlainState(messages) });
  }
}

// One run (the arguments above): its exit status.
async function run([url, chatId, text, cutArg, mode, openUrl], io) {
  if (!url || !chatId || !text || !cutArg || !['drop', 'reload', 'none'].includes(mode) || !openUrl) {
    io.err('usage: node vercel_resume.mjs <url> <chat-id> <text> <cut> drop|reload|none <open-url>');
    return 1;
  }
  const cut = Number(cutArg);

  const requests = [];
  let delivered = 0;

  // The first response's body, cut after `cut` events (blocks with a data line; comments such as
  // pings pass and do not count): the connection is closed and the body fails as a dropped one does.
  function cutting(response) {
    const whole = Math.floor(cut);
    const half = cut !== whole;
    const reader = response.body.getReader();
    let pending = new Uint8Array(0);
    const body = new ReadableStream({
      async pull(controller) {
        for (;;) {
          const end = pending.findIndex((byte, i) => byte === 10 && pending[i + 1] === 10);
          if (end < 0) break;
          const block = pending.slice(0, end + 2);
          const isEvent = new TextDecoder().decode(block).split('\n').some(row => row.startsWith('data:'));
          if (isEvent && delivered === whole) {
            if (half) controller.enqueue(block.slice(0, Math.floor(block.length / 2)));
            await reader.cancel(); // the connection is closed: the server sees the client go
            controller.error(new TypeError('network error'));
            return;
          }
          if (isEvent) delivered++;
          controller.enqueue(block);
          pending = pending.slice(end + 2);
        }
        const { value, done } = await reader.read();
        if (done) {
          controller.close();
          return;
        }
        const joined = new Uint8Array(pending.length + value.length);
        joined.set(pending);
        joined.set(value, pending.length);
        pending = joined;
      },
      cancel(reason) {
        return reader.cancel(reason);
      },
    });
    return new Response(body, { status: response.status, headers: response.headers });
  }

  const transport = new DefaultChatTransport({
    api: url,
    fetch: async (input, init) => {
      const method = init?.method ?? 'GET';
      const response = await fetch(input, init);
      requests.push([method, String(input), response.status]);
      if (method === 'POST') return cutting(response);
      await fetch(openUrl, { method: 'POST' }); // the run goes on once the resume reads it
      return response;
    },
  });

  // Each response ends with onFinish (after an error or a drop, too): the script waits for it.
  let settle;
  const finished = () =>
    new Promise((resolve, reject) => {
      settle = resolve;
      setTimeout(() => reject(new Error('no response finished within 30 s')), 30000).unref();
    });

  const errors = [];
  const init = {
    id: chatId,
    transport,
    onError: error => errors.push(String(error?.message ?? error)),
    onFinish: () => settle?.(),
  };

  try {
    let chat = new Chat(init);
    let cutMessages = null;
    let cutStatus = null;
    if (mode !== 'none') {
      const done = finished();
      await chat.sendMessage({ text });
      await done;
      cutMessages = structuredClone(chat.messages);
      cutStatus = chat.status;
      if (mode === 'reload') {
        // A reloaded page: the app gives useChat the messages it has (here: the user's), then
        // useChat({resume: true}) asks for the chat's active stream.
        chat = new Chat({ ...init, messages: [structuredClone(chat.messages[0])] });
      }
    }
    const resumed = chat.resumeStream();
    await resumed;
    const summary = {
      cut: cutMessages,
      cutStatus,
      final: chat.messages,
      status: chat.status,
      error: chat.error ? String(chat.error.message ?? chat.error) : null,
      errors,
      requests,
      chunks: delivered,
    };
    if (chat.status !== 'ready') {
      io.err(`FAILED: the chat ended ${chat.status}: ${summary.error}`);
      io.err('partial: ' + JSON.stringify(summary));
      return 2;
    }
    io.out(JSON.stringify(summary, null, 2) + '\n');
    return 0;
  } catch (err) {
    io.err(`FAILED: ${err?.name}: ${err?.message ?? err}`);
    return 5;
  }
}

const args = process.argv.slice(2);
if (args[0] === '--batch') await batch(args[1], run, { together: true });
else process.exit(await run(args, outputs(false)));
