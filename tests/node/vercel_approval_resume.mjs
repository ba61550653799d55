#!/usr/bin/env node
// Vercel AI SDK (ai@7): a tool approval's continuation cut and resumed, the way useChat({resume:
// true}) does it, without React.
//
// Usage:
//   node vercel_approval_resume.mjs <url> <chat-id> <text> <decisions-json> <cut> <mode> <open-url>
//     decisions: a list, one entry per response that asks for approval:
//                [{"<tool name>": {"approved": true|false, "reason"?: "..."}}, ...]
//     cut:  the number of SSE events the last request's response (the continuation the last
//           round of answers sent) delivers before its connection drops ("3.5": three, then half
//           of the fourth); -1: it is not cut
//     mode: "drop"   the same Chat resumes (chat.resumeStream());
//           "reload" a new Chat with the same id and the messages the app had stored (those after
//                    the first response: the assistant's message waits for approval) resumes, as
//                    useChat({resume: true}) does when it mounts
//     open-url: POSTed once the last request's response (or the resume) was answered (the test
//               server's gate: the run goes on to its end only then).
//
// A Chat (the SDK's AbstractChat over a plain state, as useChat's Chat is over React's) with the
// SDK's DefaultChatTransport (its resume is `GET <url>/<chat-id>/stream`, a replay from the start:
// resumeStreamIsReplay) and sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses.
// Each response that leaves tool parts in state `approval-requested` is answered with
// chat.addToolApprovalResponse (the next round of decisions), which sends the next request by
// itself; the response to the last round is the one cut. The drop: the response's body fails as a dropped
// connection does in a browser (a TypeError "network error": the SDK marks it resumable) and the
// connection is closed.
//
// stdout: JSON {first: messages after the first response, cut: messages after the drop, cutStatus,
//               final: messages at the end, status, error, errors,
//               requests: [[method, url, status]], chunks: events delivered before the cut}
// exit 0 ok | 1 usage | 2 the chat ended in error | 3 no approval was requested | 5 other
//
//   node vercel_approval_resume.mjs --batch <runs.json>
//     runs.json: a list of the arguments above, one list per run; the runs go at once in this one
//     process (the SDK loads once); stdout: a JSON array with, for each run, {"status", "stdout",
//     "stderr"}: what a single run exits with and prints.

import {
  AbstractChat,
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
} from 'ai';
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
async function run([url, chatId, text, decisionsArg, cutArg, mode, openUrl], io) {
  if (!url || !chatId || !text || !decisionsArg || !cutArg || !['drop', 'reload'].includes(mode) || !openUrl) {
    io.err(
      'usage: node vercel_approval_resume.mjs <url> <chat-id> <text> <decisions-json> <cut> drop|reload <open-url>',
    );
    return 1;
  }
  const rounds = JSON.parse(decisionsArg);
  const cut = Number(cutArg);

  const requests = [];
  let delivered = 0;
  let cutting = false; // the next POST's response is cut (the last approval answer's)

  // The response's body, cut after `cut` events (blocks with a data line; comments such as pings
  // pass and do not count): the connection is closed and the body fails as a dropped one does.
  function cutAfter(response) {
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
      if (method === 'POST' && !cutting) return response;
      if (method === 'POST' && cut >= 0) return cutAfter(response); // its run waits for the resume
      await fetch(openUrl, { method: 'POST' }); // the run goes on once its last reader reads it
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
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
    onError: error => errors.push(String(error?.message ?? error)),
    onFinish: () => settle?.(),
  };

  let first = null;
  let chat = new Chat(init);

  function report(extra = {}) {
    return {
      first,
      final: chat.messages,
      status: chat.status,
      error: chat.error ? String(chat.error.message ?? chat.error) : null,
      errors,
      requests,
      chunks: delivered,
      ...extra,
    };
  }

  try {
    let done = finished();
    await chat.sendMessage({ text });
    await done;
    first = structuredClone(chat.messages);
    for (const [round, decisions] of rounds.entries()) {
      const asked = chat.lastMessage.parts.filter(part => part.state === 'approval-requested');
      if (chat.status !== 'ready' || asked.length === 0) {
        io.err(`FAILED: response ${round + 1} ended ${chat.status} (${chat.error}), asking ${asked.length} approvals`);
        io.err('partial: ' + JSON.stringify(report()));
        return asked.length === 0 ? 3 : 2;
      }
      cutting = round === rounds.length - 1;
      done = finished();
      for (const part of asked) {
        const decision = decisions[part.type.replace(/^tool-/, '')];
        await chat.addToolApprovalResponse({ id: part.approval.id, approved: decision.approved, reason: decision.reason });
      }
      await done; // the request the last answer sent by itself
    }
    const cutMessages = structuredClone(chat.messages);
    const cutStatus = chat.status;
    if (cut >= 0) {
      if (mode === 'reload') {
        // A reloaded page: the app gives useChat the messages it stored after the first response,
        // then useChat({resume: true}) asks for the chat's active stream.
        chat = new Chat({ ...init, messages: structuredClone(first) });
      }
      await chat.resumeStream();
    }
    const summary = report({ cut: cutMessages, cutStatus });
    if (chat.status !== 'ready') {
      io.err(`FAILED: the chat ended ${chat.status}: ${summary.error}`);
      io.err('partial: ' + JSON.stringify(summary));
      return 2;
    }
    io.out(JSON.stringify(summary, null, 2) + '\n');
    return 0;
  } catch (err) {
    io.err(`FAILED: ${err?.name}: ${err?.message ?? err}`);
    io.err('partial: ' + JSON.stringify(report()));
    return 5;
  }
}

const args = process.argv.slice(2);
if (args[0] === '--batch') await batch(args[1], run, { together: true });
else process.exit(await run(args, outputs(false)));
