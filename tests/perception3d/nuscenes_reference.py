"""Runs in .venv-nuscenes (nuscenes-devkit pins numpy<2, so it cannot share the test venv): nuScenes' own
`accumulate` and `calc_ap` on the frames given as JSON on stdin; prints {class: {threshold: AP}} as JSON.

stdin: {"classes": [nuScenes detection names], "thresholds": [metres],
        "frames": [{"truth": [[x, y, z, l, w, h, yaw, label], ...], "found": [[..., label, score], ...]}]}
"""
import json
import math
import sys

from nuscenes.eval.common.data_classes import EvalBoxes
from nuscenes.eval.common.utils import center_distance
from nuscenes.eval.detection.algo import accumulate, calc_ap
from nuscenes.eval.detection.data_classes import DetectionBox


def box(token, row, classes, score=-1.0):
    x, y, z, l, w, h, yaw = row[:7]
    rotation = (math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2))  # a turn about z, as a quaternion (w, x, y, z)
    return DetectionBox(sample_token=token, translation=(x, y, z), size=(w, l, h), rotation=rotation,
                        detection_name=classes[int(row[7])], detection_score=score)


def main():
    doc = json.load(sys.stdin)
    classes = doc["classes"]
    truth, found = EvalBoxes(), EvalBoxes()
    for i, frame in enumerate(doc["frames"]):
        token = f"frame{i}"
        truth.add_boxes(token, [box(token, row, classes) for row in frame["truth"]])
        found.add_boxes(token, [box(token, row, classes, float(row[8])) for row in frame["found"]])
    out = {name: {str(t): calc_ap(accumulate(truth, found, name, center_distance, t), 0.1, 0.1)
                  for t in doc["thresholds"]} for name in classes}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
