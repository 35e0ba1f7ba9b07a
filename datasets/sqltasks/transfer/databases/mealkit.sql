-- A meal-kit subscription service: users (some referred by others) subscribe to plans, receive
-- weekly deliveries of recipes, and rate them; recipes have ingredients and ordered steps.
CREATE TABLE users (id INTEGER PRIMARY KEY, email VARCHAR NOT NULL, display_name VARCHAR NOT NULL, city VARCHAR NOT NULL, signed_up_on DATE NOT NULL, referred_by INTEGER REFERENCES users(id));
CREATE TABLE plans (id INTEGER PRIMARY KEY, name VARCHAR NOT NULL, meals_per_week INTEGER NOT NULL, price_per_week DECIMAL(6, 2) NOT NULL);
CREATE TABLE subscriptions (id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL REFERENCES users(id), plan_id INTEGER NOT NULL REFERENCES plans(id), started_on DATE NOT NULL, cancelled_on DATE, status VARCHAR NOT NULL);
CREATE TABLE recipes (id INTEGER PRIMARY KEY, title VARCHAR NOT NULL, cuisine VARCHAR NOT NULL, prep_minutes INTEGER NOT NULL, calories INTEGER, is_vegan BOOLEAN NOT NULL);
CREATE TABLE ingredients (id INTEGER PRIMARY KEY, name VARCHAR NOT NULL, allergen VARCHAR);
CREATE TABLE recipe_ingredients (recipe_id INTEGER NOT NULL REFERENCES recipes(id), ingredient_id INTEGER NOT NULL REFERENCES ingredients(id), grams INTEGER NOT NULL, PRIMARY KEY (recipe_id, ingredient_id));
CREATE TABLE recipe_steps (recipe_id INTEGER NOT NULL REFERENCES recipes(id), "order" INTEGER NOT NULL, instruction VARCHAR NOT NULL, PRIMARY KEY (recipe_id, "order"));
CREATE TABLE deliveries (id INTEGER PRIMARY KEY, subscription_id INTEGER NOT NULL REFERENCES subscriptions(id), delivered_on DATE NOT NULL, box_size VARCHAR NOT NULL, on_time BOOLEAN NOT NULL);
CREATE TABLE delivery_recipes (delivery_id INTEGER NOT NULL REFERENCES deliveries(id), recipe_id INTEGER NOT NULL REFERENCES recipes(id), servings INTEGER NOT NULL, PRIMARY KEY (delivery_id, recipe_id));
CREATE TABLE ratings (id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL REFERENCES users(id), recipe_id INTEGER NOT NULL REFERENCES recipes(id), stars INTEGER NOT NULL, rated_on DATE NOT NULL);
INSERT INTO users VALUES (1, 'lena@mail.example', 'Lena K', 'Hamburg', DATE '2023-01-05', NULL);
INSERT INTO users VALUES (2, 'sam@mail.example', 'Sam O', 'Munich', DATE '2023-02-11', 1);
INSERT INTO users VALUES (3, 'yara@mail.example', 'Yara M', 'Hamburg', DATE '2023-03-27', 1);
INSERT INTO users VALUES (4, 'tim@mail.example', 'Tim B', 'Cologne', DATE '2023-06-14', NULL);
INSERT INTO users VALUES (5, 'ana@mail.example', 'Ana P', 'Munich', DATE '2023-09-02', 2);
INSERT INTO users VALUES (6, 'jo@mail.example', 'Jo W', 'Leipzig', DATE '2024-01-19', 4);
INSERT INTO users VALUES (7, 'mei@mail.example', 'Mei L', 'Hamburg', DATE '2024-03-08', 3);
INSERT INTO users VALUES (8, 'ben@mail.example', 'Ben R', 'Cologne', DATE '2024-04-30', NULL);
INSERT INTO plans VALUES (1, 'Solo', 3, 39.90), (2, 'Duo', 3, 59.90), (3, 'Family', 4, 89.90), (4, 'Veggie Duo', 3, 54.90);
INSERT INTO subscriptions VALUES
  (1, 1, 2, DATE '2023-01-05', NULL, 'active'),
  (2, 2, 1, DATE '2023-02-11', DATE '2023-08-01', 'cancelled'),
  (3, 3, 3, DATE '2023-03-27', NULL, 'active'),
  (4, 4, 4, DATE '2023-06-14', NULL, 'paused'),
  (5, 5, 2, DATE '2023-09-02', DATE '2024-02-10', 'cancelled'),
  (6, 6, 1, DATE '2024-01-19', NULL, 'active'),
  (7, 2, 4, DATE '2024-02-01', NULL, 'active'),
  (8, 7, 3, DATE '2024-03-08', NULL, 'active');
INSERT INTO recipes VALUES
  (1, 'Miso salmon with greens', 'japanese', 25, 610, FALSE),
  (2, 'Chickpea tikka masala', 'indian', 35, 540, TRUE),
  (3, 'Mushroom risotto', 'italian', 40, 680, FALSE),
  (4, 'Black bean tacos', 'mexican', 20, 520, TRUE),
  (5, 'Beef bulgogi bowl', 'korean', 30, 720, FALSE),
  (6, 'Lemon orzo salad', 'greek', 15, NULL, TRUE),
  (7, 'Chicken katsu curry', 'japanese', 45, 830, FALSE),
  (8, 'Peanut noodle stir-fry', 'thai', 20, 650, TRUE),
  (9, 'Roast pumpkin soup', 'british', 50, 390, TRUE);
INSERT INTO ingredients VALUES
  (1, 'salmon fillet', 'fish'), (2, 'miso paste', 'soy'), (3, 'chickpeas', NULL), (4, 'coconut milk', NULL),
  (5, 'arborio rice', NULL), (6, 'parmesan', 'milk'), (7, 'black beans', NULL), (8, 'corn tortillas', NULL),
  (9, 'beef strips', NULL), (10, 'orzo', 'gluten'), (11, 'panko', 'gluten'), (12, 'peanut butter', 'peanuts'),
  (13, 'rice noodles', NULL), (14, 'chicken breast', NULL), (15, 'smoked tofu', 'soy');
INSERT INTO recipe_ingredients VALUES
  (1, 1, 250), (1, 2, 30), (2, 3, 240), (2, 4, 200), (3, 5, 180), (3, 6, 40), (4, 7, 240), (4, 8, 160),
  (5, 9, 300), (5, 5, 150), (6, 10, 160), (7, 14, 280), (7, 11, 60), (7, 5, 150), (8, 12, 60), (8, 13, 200);
INSERT INTO recipe_steps VALUES
  (1, 1, 'Heat the oven to 200C.'), (1, 2, 'Brush the salmon with miso.'), (1, 3, 'Roast for 12 minutes.'),
  (2, 1, 'Fry the spices.'), (2, 2, 'Add chickpeas and coconut milk.'), (3, 1, 'Toast the rice.'),
  (3, 2, 'Add stock slowly while stirring.'), (3, 3, 'Finish with parmesan.'), (3, 4, 'Rest for 2 minutes.'),
  (4, 1, 'Warm the beans.'), (4, 2, 'Fill the tortillas.'), (7, 1, 'Coat the chicken in panko.'),
  (7, 2, 'Fry until golden.'), (7, 3, 'Serve with curry sauce.');
INSERT INTO deliveries VALUES
  (1, 1, DATE '2024-03-04', 'medium', TRUE), (2, 3, DATE '2024-03-04', 'large', TRUE),
  (3, 4, DATE '2024-03-05', 'medium', FALSE), (4, 6, DATE '2024-03-05', 'small', TRUE),
  (5, 7, DATE '2024-03-06', 'medium', TRUE), (6, 1, DATE '2024-03-11', 'medium', FALSE),
  (7, 3, DATE '2024-03-11', 'large', TRUE), (8, 8, DATE '2024-03-12', 'large', TRUE),
  (9, 6, DATE '2024-03-12', 'small', FALSE), (10, 7, DATE '2024-03-13', 'medium', TRUE);
INSERT INTO delivery_recipes VALUES
  (1, 1, 2), (1, 3, 2), (2, 5, 4), (2, 7, 4), (2, 4, 4), (3, 2, 2), (3, 6, 2), (4, 4, 1), (4, 8, 1),
  (5, 2, 2), (5, 8, 2), (6, 7, 2), (6, 1, 2), (7, 3, 4), (7, 5, 4), (8, 7, 4), (8, 4, 4), (9, 6, 1),
  (10, 6, 2), (10, 2, 2);
INSERT INTO ratings VALUES
  (1, 1, 1, 5, DATE '2024-03-06'), (2, 1, 3, 4, DATE '2024-03-07'), (3, 3, 5, 5, DATE '2024-03-06'),
  (4, 3, 7, 3, DATE '2024-03-08'), (5, 4, 2, 4, DATE '2024-03-07'), (6, 4, 6, 2, DATE '2024-03-09'),
  (7, 6, 8, 5, DATE '2024-03-07'), (8, 2, 2, 3, DATE '2024-03-08'), (9, 7, 7, 4, DATE '2024-03-14'),
  (10, 1, 7, 2, DATE '2024-03-13'), (11, 6, 6, 3, DATE '2024-03-14');
