"""An FFRecord training script, written against FFRecord's API as its users write them.

It has the shape of FFRecord's examples/imagenet (imagenet2ffrecord.py, then train.py:
a Dataset whose __getitem__ reads a batch with FileReader.read, a DistributedSampler,
ffrecord.torch.DataLoader with set_step to resume a suspended run mid-epoch, a
checkpoint in latest.pt) and of examples/cocodetection (a Dataset with process()),
scaled to a synthetic 8x8 "ImageNet" on the CPU.  hfai's suspend command is replaced
by --suspend-at EPOCH STEP.  The final evaluation uses torch's own DataLoader with
spawned workers, which an FFRecord Dataset also works with (batch_size=None and a
BatchSampler: each batch is one dataset[indices] call).

    python train_imagenet.py WORKDIR [--suspend-at EPOCH STEP]

tests/test_ffrecord_script.py runs it with its one FFRecord import line replaced.
"""

import argparse
import json
import os
import pickle
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.optim import SGD
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import BatchSampler, SequentialSampler, default_collate
from torch.utils.data.distributed import DistributedSampler

import ffrecord.torch


class DumpDataset:
    """imagenet2ffrecord.py's DumpDataset: each sample pickled."""

    def __init__(self, n, seed):
        rng = np.random.default_rng(seed)
        self.images = rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8)
        self.labels = rng.integers(0, 4, n)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return pickle.dumps((self.images[index], int(self.labels[index])))


def dump_imagenet(data_dir):
    train_dir = os.path.join(data_dir, 'train.ffr')
    # we recommend users to split data into >= 16 files
    ffrecord.utils.dump(DumpDataset(120, seed=0), train_dir, nfiles=4)

    # the validation set as one file, written with FileWriter
    _, val_file = tempfile.mkstemp(suffix='.ffr', dir=data_dir)
    val = DumpDataset(40, seed=1)
    writer = ffrecord.FileWriter(val_file, len(val))
    for i in range(len(val)):
        writer.write_one(val[i])
    writer.close()
    return train_dir, val_file


def to_tensor(img):
    return torch.from_numpy(img).permute(2, 0, 1).float() / 255


class FireFlyerImageNet(ffrecord.torch.Dataset):
    def __init__(self, fnames, transform=None):
        self.reader = ffrecord.FileReader(fnames, check_data=True)
        self.transform = transform

    def __len__(self):
        return self.reader.n

    def __getitem__(self, indices):
        data = self.reader.read(indices)
        samples = []

        for bytes_ in data:
            img, label = pickle.loads(bytes_)
            if self.transform:
                img = self.transform(img)
            samples.append((img, label))

        # default collate_fn would handle them
        return samples


class ValDataset(ffrecord.torch.Dataset):
    """cocodetection's style: the base class reads, process() deserializes."""

    def __init__(self, fname, transform=None):
        super().__init__(fname)
        self.transform = transform

    def process(self, indexes, data):
        samples = []
        for bytes_ in data:
            img, label = pickle.loads(bytes_)
            samples.append((self.transform(img), label))
        return samples


def log(save_path, **record):
    with open(os.path.join(save_path, 'log.jsonl'), 'a') as f:
        f.write(json.dumps(record) + '\n')


def train(dataloader, model, criterion, optimizer, scheduler, epoch, start_step, best_acc, save_path,
          suspend_at):
    model.train()

    for step, batch in enumerate(dataloader):
        step += start_step

        samples, labels = batch
        outputs = model(samples)
        optimizer.zero_grad()
        loss = criterion(outputs, labels)
        loss.backward()
        optimizer.step()
        log(save_path, epoch=epoch, step=step, labels=labels.tolist(),
            sums=[round(x, 4) for x in samples.flatten(1).sum(1).tolist()])

        if (epoch, step) == suspend_at:
            state = {
                'model': model.state_dict(),
                'optimizer': optimizer.state_dict(),
                'scheduler': scheduler.state_dict(),
                'acc': best_acc,
                'epoch': epoch,
                'step': step + 1
            }
            torch.save(state, os.path.join(save_path, 'latest.pt'))
            return True
    return False


@torch.no_grad()
def validate(dataloader, model, criterion, epoch, save_path):
    loss, correct, total = 0.0, 0, 0
    model.eval()
    for samples, labels in dataloader:
        outputs = model(samples)
        loss += criterion(outputs, labels).item()
        correct += (outputs.argmax(1) == labels).sum().item()
        total += len(labels)
    log(save_path, epoch=epoch, val_loss=round(loss / len(dataloader), 6), acc=correct / total)
    return correct / total


def main(work, suspend_at):
    epochs = 3
    batch_size = 8
    num_workers = 2
    save_path = os.path.join(work, 'output')
    Path(save_path).mkdir(exist_ok=True, parents=True)
    data_dir = os.path.join(work, 'data')
    if not os.path.exists(data_dir):
        os.makedirs(data_dir)
        dump_imagenet(data_dir)
    train_data = os.path.join(data_dir, 'train.ffr')
    val_data = [str(p) for p in Path(data_dir).glob('tmp*.ffr')][0]

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 4))
    train_dataset = FireFlyerImageNet(train_data, transform=to_tensor)
    train_datasampler = DistributedSampler(train_dataset, num_replicas=1, rank=0)
    train_dataloader = ffrecord.torch.DataLoader(train_dataset,
                                                 batch_size,
                                                 sampler=train_datasampler,
                                                 num_workers=num_workers)

    val_dataset = FireFlyerImageNet(val_data, transform=to_tensor)
    val_dataloader = ffrecord.torch.DataLoader(val_dataset, batch_size, num_workers=num_workers)

    criterion = nn.CrossEntropyLoss()
    optimizer = SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    scheduler = StepLR(optimizer, step_size=2, gamma=0.1)

    best_acc, start_epoch, start_step = 0, 0, 0
    if os.path.exists(os.path.join(save_path, 'latest.pt')):
        ckpt = torch.load(os.path.join(save_path, 'latest.pt'), map_location='cpu')
        model.load_state_dict(ckpt['model'])
        optimizer.load_state_dict(ckpt['optimizer'])
        scheduler.load_state_dict(ckpt['scheduler'])
        best_acc, start_epoch = ckpt['acc'], ckpt['epoch']
        start_step = ckpt['step']

    for epoch in range(start_epoch, epochs):
        # resume from epoch and step
        train_datasampler.set_epoch(epoch)
        train_dataloader.set_step(start_step)

        if train(train_dataloader, model, criterion, optimizer, scheduler, epoch, start_step, best_acc,
                 save_path, suspend_at):
            return  # suspended
        start_step = 0  # reset
        scheduler.step()
        acc = validate(val_dataloader, model, criterion, epoch, save_path)
        state = {
            'model': model.state_dict(),
            'optimizer': optimizer.state_dict(),
            'scheduler': scheduler.state_dict(),
            'acc': best_acc,
            'epoch': epoch + 1,
            'step': 0
        }
        torch.save(state, os.path.join(save_path, 'latest.pt'))
        best_acc = max(best_acc, acc)

    # a last evaluation with torch's DataLoader and spawned workers
    eval_set = ValDataset(val_data, transform=to_tensor)
    eval_loader = torch.utils.data.DataLoader(
        eval_set,
        batch_size=None,
        sampler=BatchSampler(SequentialSampler(eval_set), batch_size, drop_last=False),
        collate_fn=default_collate,
        num_workers=num_workers,
        multiprocessing_context='spawn',
    )
    validate(eval_loader, model, criterion, 'final', save_path)
    log(save_path, version=ffrecord.__version__, readers=len(train_dataset.ffreaders()))


if __name__ == '__main__':
    parser = argparse.ArgumentParser()
    parser.add_argument('work')
    parser.add_argument('--suspend-at', nargs=2, type=int)
    args = parser.parse_args()
    main(args.work, tuple(args.suspend_at) if args.suspend_at else None)
