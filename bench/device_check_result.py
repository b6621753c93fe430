"""What every device check's result records (bench/device-check-*.sh): the date, the commit the
caller passed (record_hardware_and_commit in device-check-common.sh wrote it to $OUT/commit) and
the hardware read from the machine ($OUT/gpu.csv from nvidia-smi, CPUs, memory)."""
import datetime
import json
import os


def load(path):
    """A JSON file a step of the check wrote, or None when it did not."""
    return json.load(open(path)) if os.path.exists(path) and os.path.getsize(path) else None


def header(out):
    rows = [r.strip() for r in open(os.path.join(out, 'gpu.csv')).read().splitlines() if r.strip()]
    gpu = dict(zip([h.strip() for h in rows[0].split(',')], [v.strip() for v in rows[1].split(',')])) if len(rows) >= 2 else {}
    mem = next((int(l.split()[1]) * 1024 for l in open('/proc/meminfo') if l.startswith('MemTotal')), 0)
    return {'date': datetime.datetime.utcnow().strftime('%Y-%m-%dT%H:%M:%SZ'),
            'commit': open(os.path.join(out, 'commit')).read().strip(),
            'hardware': {'gpu': gpu, 'cpus': os.cpu_count(), 'memory_bytes': mem}}
