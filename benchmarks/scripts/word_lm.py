"""A word-level LSTM language model trained the way pytorch/examples' word_language_model does:
an embedding, a 2-layer LSTM and a decoder, the hidden state carried across batches and
detached each step, gradients clipped, the update written by hand, the loss read every batch,
a log line every few batches. Run it unchanged with ``%run`` (tests/kernel/test_fused_in_kernel.py
runs it three times in fused mode). The corpus is generated (a Zipf-distributed token stream),
so nothing is downloaded."""

from __future__ import annotations

import argparse
import math
import time

import torch
from torch import nn

parser = argparse.ArgumentParser(description="word-level LSTM language model")
parser.add_argument("--vocab", type=int, default=2000)
parser.add_argument("--emsize", type=int, default=200)
parser.add_argument("--nhid", type=int, default=200)
parser.add_argument("--nlayers", type=int, default=2)
parser.add_argument("--lr", type=float, default=20.0)
parser.add_argument("--clip", type=float, default=0.25)
parser.add_argument("--batch-size", type=int, default=20)
parser.add_argument("--bptt", type=int, default=35)
parser.add_argument("--dropout", type=float, default=0.2)
parser.add_argument("--batches", type=int, default=20, help="training batches to run")
parser.add_argument("--log-interval", type=int, default=5)
parser.add_argument("--seed", type=int, default=1111)
args = parser.parse_args()

torch.manual_seed(args.seed)
ranks = torch.arange(1, args.vocab + 1, dtype=torch.float)
stream = torch.multinomial(1.0 / ranks, (args.batches + 2) * args.bptt * args.batch_size, replacement=True)


def batchify(data: torch.Tensor, batch_size: int) -> torch.Tensor:
    columns = data.size(0) // batch_size
    return data[: columns * batch_size].view(batch_size, -1).t().contiguous()


class RNNModel(nn.Module):
    def __init__(self, ntoken: int, ninp: int, nhid: int, nlayers: int, dropout: float) -> None:
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nhid, self.nlayers = nhid, nlayers
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def forward(self, tokens, hidden):
        output, hidden = self.rnn(self.drop(self.encoder(tokens)), hidden)
        return self.decoder(self.drop(output)), hidden

    def init_hidden(self, batch_size: int):
        weight = next(self.parameters())
        zeros = weight.new_zeros(self.nlayers, batch_size, self.nhid)
        return zeros, zeros.clone()


def detached(hidden):
    return hidden.detach() if isinstance(hidden, torch.Tensor) else tuple(detached(h) for h in hidden)


train_data = batchify(stream, args.batch_size)
model = RNNModel(args.vocab, args.emsize, args.nhid, args.nlayers, args.dropout)
criterion = nn.CrossEntropyLoss()
model.train()
hidden = model.init_hidden(args.batch_size)
total_loss, started = 0.0, time.time()
losses = []
for batch in range(args.batches):
    i = batch * args.bptt
    data, targets = train_data[i : i + args.bptt], train_data[i + 1 : i + 1 + args.bptt].reshape(-1)
    model.zero_grad()
    hidden = detached(hidden)
    output, hidden = model(data, hidden)
    loss = criterion(output.view(-1, args.vocab), targets)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-args.lr)
    total_loss += loss.item()
    losses.append(loss.item())
    if (batch + 1) % args.log_interval == 0:
        average = total_loss / args.log_interval
        elapsed_ms = (time.time() - started) * 1000 / args.log_interval
        perplexity = math.exp(average)
        timing = f"| {batch + 1:4d} batches | ms/batch {elapsed_ms:6.1f}"
        print(f"{timing} | loss {average:5.2f} | ppl {perplexity:8.1f}")
        total_loss, started = 0.0, time.time()
