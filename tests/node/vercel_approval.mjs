#!/usr/bin/env node
// Vercel AI SDK (ai@7) tool approval, the way useChat does it, without React.
//
// Usage:
//   node vercel_approval.mjs <url> <chat-id> <text> <decisions-json>
//     decisions: {"<tool name>": {"approved": true|false, "reason"?: "..."}}
//
// A Chat (the SDK's AbstractChat over a plain state, as useChat's Chat is over React's) with the
// SDK's DefaultChatTransport and sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses.
// It sends the user's text; the response must leave tool parts in state `approval-requested`; each
// is answered with chat.addToolApprovalResponse({id, approved, reason}), which sends the next
// request by itself (the SDK builds its body: the whole chat, the last message's parts in state
// `approval-responded`). The transport validates every chunk (uiMessageChunkSchema) and the chat
// runs the same processUIMessageStream state machine as useChat.
//
// stdout: JSON {first: messages after the first response, final: messages at the end,
//               requests: the request bodies the transport sent, status, error}
// exit 0 ok | 1 usage | 2 the chat ended in error | 3 no approval was requested | 5 other

import {
  AbstractChat,
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
} from 'ai';

const [url, chatId, text, decisionsArg] = process.argv.slice(2);
if (!url || !chatId || !text || !decisionsArg) {
  console.error('usage: node vercel_approval.mjs <url> <chat-id> <text> <decisions-json>');
  process.exit(1);
}
const decisions = JSON.parse(decisionsArg);

class PlainState {
  constructor() {
    this.status = 'ready';
    this.error = undefined;
    this.messages = [];
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
  constructor(init) {
    super({ ...init, state: new PlainState() });
  }
}

const requests = [];
const transport = new DefaultChatTransport({
  api: url,
  fetch: async (input, init) => {
    requests.push(JSON.parse(init.body));
    return fetch(input, init);
  },
});

// Each response ends with onFinish (after an error, too): the script waits for it, never polls.
let settle;
const finished = () =>
  new Promise((resolve, reject) => {
    settle = resolve;
    setTimeout(() => reject(new Error('no response finished within 30 s')), 30000).unref();
  });

const errors = [];
const chat = new Chat({
  id: chatId,
  transport,
  sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
  onError: error => errors.push(String(error?.message ?? error)),
  onFinish: () => settle?.(),
});

function report(first) {
  return {
    first,
    final: chat.messages,
    requests,
    status: chat.status,
    error: chat.error ? String(chat.error.message ?? chat.error) : null,
    errors,
  };
}

try {
  let done = finished();
  await chat.sendMessage({ text });
  await done;
  const first = structuredClone(chat.messages);
  if (chat.status !== 'ready') {
    console.error(`FAILED: the first response ended ${chat.status}: ${chat.error}`);
    console.error('partial: ' + JSON.stringify(report(first)));
    process.exit(2);
  }
  const asked = chat.lastMessage.parts.filter(part => part.state === 'approval-requested');
  if (asked.length === 0) {
    console.error('FAILED: no tool part waits for approval');
    console.error('partial: ' + JSON.stringify(report(first)));
    process.exit(3);
  }
  done = finished();
  for (const part of asked) {
    const decision = decisions[part.type.replace(/^tool-/, '')];
    await chat.addToolApprovalResponse({ id: part.approval.id, approved: decision.approved, reason: decision.reason });
  }
  await done; // the request the last answer sent by itself
  const summary = report(first);
  if (chat.status !== 'ready') {
    console.error(`FAILED: the chat ended ${chat.status}: ${summary.error}`);
    console.error('partial: ' + JSON.stringify(summary));
    process.exit(2);
  }
  process.stdout.write(JSON.stringify(summary, null, 2) + '\n');
  process.exit(0);
} catch (err) {
  console.error(`FAILED: ${err?.name}: ${err?.message ?? err}`);
  console.error('partial: ' + JSON.stringify(report(null)));
  process.exit(5);
}
