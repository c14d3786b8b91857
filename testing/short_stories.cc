// The documents of the real-model fidelity prompts (testing/real_model.h):
// short stories in the simple style of the TinyStories data the checkpoint
// was trained on, written for tierkv. Each ends with a newline, so stories
// placed one after another read as separate texts.
#include <array>
#include <span>
#include <string_view>

#include "testing/real_model.h"

namespace tierkv {
namespace {

constexpr std::array<std::string_view, 20> kStories = {
    "Tom had a red kite. One windy day he ran up the hill and let it fly. "
    "The kite went high into the sky. Tom laughed and held the string "
    "tight.\n",
    "Mia found a small bird under a tree. Its wing was hurt. She put it in a "
    "box with soft grass and gave it water. After three days the bird could "
    "fly again.\n",
    "Ben and his dad baked a big cake. They put in eggs, milk and sugar. The "
    "cake was too hot to eat, so they waited. Then they shared it with "
    "Grandma.\n",
    "A little frog lived in a pond. Every night he sang to the moon. One "
    "night the moon seemed to smile back, and the frog sang louder than "
    "ever.\n",
    "Sara lost her blue ball in the park. She looked under the bench and "
    "behind the slide. A kind dog came and dropped the ball at her feet. "
    "Sara gave the dog a hug.\n",
    "Max the cat liked to sleep in the sun. One day a loud noise woke him "
    "up. It was only the rain. Max went inside and slept on the warm "
    "bed.\n",
    "Lucy wanted to help her mom in the garden. She dug small holes and "
    "put seeds in them. Every day she gave them water. Soon red flowers "
    "grew, and Lucy was proud.\n",
    "Two friends, Sam and Anna, built a boat from a box. They painted it "
    "green. When they put it in the pool, it floated! They cheered and "
    "played until dinner.\n",
    "A big bear was very hungry. He looked for honey in the woods. He found "
    "a tree full of bees. The bees were angry, so the bear ran away and ate "
    "berries instead.\n",
    "Jack had a new pair of shoes. They were shiny and black. He jumped in "
    "a puddle, and the shoes got dirty. His mom helped him clean them, and "
    "Jack said sorry.\n",
    "Emma liked to draw. She drew a house, a tree and a happy sun. She gave "
    "the picture to her teacher. The teacher put it on the wall for "
    "everyone to see.\n",
    "A small duck could not swim. The other ducks swam far away. The duck "
    "tried and tried. At last she paddled across the pond, and her mother "
    "quacked with joy.\n",
    "Leo was scared of the dark. His sister gave him a little lamp shaped "
    "like a star. The soft light made his room feel safe, and Leo fell "
    "asleep with a smile.\n",
    "The farmer had a brown cow named Daisy. Daisy did not want to go into "
    "the barn. The farmer sang her a song, and Daisy slowly walked "
    "inside.\n",
    "Lily and her brother went to the beach. They built a big sand castle "
    "with a tall tower. A wave came and washed it away, but they just "
    "laughed and built another one.\n",
    "A tiny mouse found a piece of cheese. It was too big to carry. He "
    "asked his friends to help, and together they pulled the cheese home. "
    "They ate it all night.\n",
    "Tim wanted to be a pilot. He made wings out of paper and ran around "
    "the yard. His grandpa took him to see real planes, and Tim waved at "
    "every one.\n",
    "The old tree in the park had a hole in it. An owl lived there. Every "
    "evening the owl looked out and said hoot to the children going "
    "home.\n",
    "Kate shared her toys with a new girl at school. The girl was shy at "
    "first. Then they played with blocks and dolls, and soon they were best "
    "friends.\n",
    "A puppy named Spot dug a hole in the yard. He found an old bone and a "
    "shiny coin. Spot gave the coin to his boy, who put it in a jar.\n",
};

}  // namespace

std::span<const std::string_view> ShortStories() { return kStories; }

}  // namespace tierkv
